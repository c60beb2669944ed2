"""PretrainModule: the objective, the optimizer recipe, and that the loss really falls."""

import pytest
import torch

from bert_repro.tasks.base import decay_groups, linear_warmup_decay
from bert_repro.tasks.pretrain import PretrainModule

from .helpers import ScalarReads, pretrain_losses

TINY = dict(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4, hidden_dropout=0.0,
            attention_dropout=0.0)
OPTIM = dict(lr=1e-3, betas=[0.9, 0.999], eps=1e-6, weight_decay=0.01, warmup_steps=2, warmup_ratio=None)


def batch(B=4, T=16, P=3, vocab=64, pad_last=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (B, T), generator=g)
    ids[:, 0], ids[:, -1] = 2, 3
    mask = torch.ones(B, T, dtype=torch.long)
    mask[-1, T - pad_last:] = 0
    ids[mask == 0] = 0
    positions = torch.stack([torch.randperm(T - pad_last - 2, generator=g)[:P] + 1 for _ in range(B)])
    return {
        "input_ids": ids, "token_type_ids": torch.zeros_like(ids), "attention_mask": mask,
        "masked_lm_positions": positions, "masked_lm_ids": ids.gather(1, positions),
        "masked_lm_weights": torch.tensor([[1.0] * P] * (B - 1) + [[1.0] * (P - 1) + [0.0]]),
        "next_sentence_labels": torch.randint(0, 2, (B,), generator=g),
    }


def overfit(module, b, steps=60):
    return pretrain_losses(module, [b] * steps, lr=3e-3)


@pytest.fixture(autouse=True)
def _no_lightning_log(monkeypatch):
    monkeypatch.setattr(PretrainModule, "log", lambda *a, **k: None)
    monkeypatch.setattr(PretrainModule, "log_dict", lambda *a, **k: None)


@pytest.mark.slow
def test_mlm_nsp_loss_falls_on_one_batch():
    torch.manual_seed(0)
    module = PretrainModule(model=TINY, optim=OPTIM)
    losses = overfit(module, batch())
    assert losses[0] > 3.0  # ~ln(64) + ln(2) at initialisation
    assert losses[-1] < 0.2 * losses[0]


def test_loss_is_mean_mlm_at_chosen_positions_plus_mean_nsp():
    torch.manual_seed(0)
    module = PretrainModule(model=TINY, optim=OPTIM).eval()
    b = batch()
    with torch.no_grad():
        loss = module._step(b, "val")
        # logits at every position
        out = module.model(b["input_ids"], b["token_type_ids"], b["attention_mask"])
        keep = b["masked_lm_weights"] > 0
        logits = out.mlm_logits.gather(1, b["masked_lm_positions"][..., None].expand(-1, -1, 64))[keep]
        expected = (torch.nn.functional.cross_entropy(logits, b["masked_lm_ids"][keep])
                    + torch.nn.functional.cross_entropy(out.nsp_logits, b["next_sentence_labels"]))
    torch.testing.assert_close(loss, expected)


def test_no_nsp_has_no_nsp_head():
    module = PretrainModule(model=TINY, optim=OPTIM, nsp=False)
    assert module.model.nsp is None and not any(k.startswith("nsp") for k in module.model.state_dict())


@pytest.mark.slow
def test_ltr_predicts_every_next_token_and_needs_causal():
    with pytest.raises(ValueError, match="causal"):
        PretrainModule(model=TINY, optim=OPTIM, nsp=False, ltr=True)
    torch.manual_seed(0)
    module = PretrainModule(model={**TINY, "causal": True}, optim=OPTIM, nsp=False, ltr=True)
    b = batch()
    positions, real = module._predictions(b)
    assert int(real.sum()) == int(b["attention_mask"][:, 1:].sum())  # every real next token, no padding
    assert positions.shape == (4, 15) and positions[0].tolist() == list(range(15))
    losses = overfit(module, {k: b[k] for k in ("input_ids", "token_type_ids", "attention_mask")}, steps=80)
    assert losses[-1] < 0.5 * losses[0]


def test_warmup_then_linear_decay():
    f = linear_warmup_decay(warmup_steps=10, total_steps=110)
    assert f(0) == pytest.approx(0.1) and f(9) == pytest.approx(1.0)
    assert f(60) == pytest.approx(0.5) and f(110) == 0.0 and f(500) == 0.0


def test_weight_decay_only_on_matrices():
    module = PretrainModule(model=TINY, optim=OPTIM)
    decay, no_decay = decay_groups(module, 0.01)
    names = {id(p): n for n, p in module.named_parameters()}
    assert all(p.ndim >= 2 for p in decay["params"])
    assert all("LayerNorm" in names[id(p)] or names[id(p)].endswith("bias") for p in no_decay["params"])
    assert decay["weight_decay"] == 0.01 and no_decay["weight_decay"] == 0.0


def _per_position_logits(module, b) -> torch.Tensor:
    """Run the module's own training step and catch the logits it scores: (B, T-1, V) for the LTR model."""
    caught = {}
    hook = module.model.register_forward_hook(lambda mod, args, out: caught.update(logits=out.mlm_logits))
    with torch.no_grad():
        module._step(b, "val")
    hook.remove()
    positions, real = module._predictions(b)
    logits = torch.full((*positions.shape, caught["logits"].shape[-1]), float("nan"))
    logits[real] = caught["logits"]  # (N, V) back to (B, T-1, V); padding stays NaN
    return logits


@pytest.mark.parametrize("pad_last", [4, 0])  # with padding (explicit SDPA masks) and without (is_causal)
@pytest.mark.parametrize("causal", [True, False])
def test_ltr_model_never_sees_the_future(causal, pad_last):
    """Table 5 "LTR": change the tokens after t and nothing the module computes at positions <= t moves
    (logits, hence each position's loss); the bidirectional control shows the test can see a leak."""
    torch.manual_seed(0)
    # larger weights: sharper attention, larger leaks
    model = {**TINY, "causal": True, "initializer_range": 0.2}
    module = PretrainModule(model=model, optim=OPTIM, nsp=False, ltr=True).eval()
    module.model.config.causal = causal  # the control: the same weights, attention both ways
    for layer in module.model.bert.encoder.layer:
        layer.attention.causal = causal
    b = {k: v for k, v in batch(pad_last=pad_last).items() if k in ("input_ids", "token_type_ids",
                                                                    "attention_mask")}
    t = 7
    changed = {**b, "input_ids": b["input_ids"].clone()}
    # new tokens after t
    changed["input_ids"][:, t + 1 : -5] = (changed["input_ids"][:, t + 1 : -5] + 11) % 59 + 5
    before, after = _per_position_logits(module, b), _per_position_logits(module, changed)
    if causal:
        torch.testing.assert_close(after[:, : t + 1], before[:, : t + 1], atol=1e-6, rtol=1e-6,
                                   equal_nan=True)
        # later positions do see it
        assert (after[:, t + 1 :] - before[:, t + 1 :]).abs().nan_to_num().amax() > 1e-3
    else:
        assert (after[:, : t + 1] - before[:, : t + 1]).abs().nan_to_num().amax() > 1e-3


def _with_trainer(module, monkeypatch, max_steps: int, estimated: int):
    trainer = type("T", (), {"max_steps": max_steps, "estimated_stepping_batches": estimated,
                             "gradient_clip_val": 1.0, "precision": "32-true"})()
    monkeypatch.setattr(type(module), "trainer", property(lambda self: trainer))
    return module.configure_optimizers()["lr_scheduler"]["scheduler"]


def test_schedule_steps_lays_the_schedule_over_both_phases(monkeypatch):
    """v2 A.2: phase 1 runs 90% of the steps on a schedule as long as both phases; phase 2 continues it."""
    module = PretrainModule(model=TINY, optim={**OPTIM, "warmup_steps": 10, "schedule_steps": 100})
    factor = _with_trainer(module, monkeypatch, max_steps=90, estimated=90).lr_lambdas[0]
    assert factor(9) == pytest.approx(1.0) and factor(55) == pytest.approx(45 / 90)
    assert factor(90) == pytest.approx(10 / 90)  # phase 1 ends at 10% of the peak, not at 0
    without = PretrainModule(model=TINY, optim=OPTIM)  # no schedule_steps: the run's own steps
    assert (_with_trainer(without, monkeypatch, max_steps=90, estimated=90).lr_lambdas[0](89)
            == pytest.approx(1 / 88))
    with pytest.raises(ValueError, match="max_steps=120 runs past optim.schedule_steps=100"):
        _with_trainer(module, monkeypatch, max_steps=120, estimated=120)


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_trains_with_gradient_clipping_at_each_precision(precision):
    """Lightning's mixed-precision plugin refuses to clip for an optimizer that unscales in its own step (the
    fused AdamW): under bf16-mixed the run takes the foreach kernel and clips, where it stopped at step 1."""
    import lightning as L

    module = PretrainModule(model=TINY, optim={**OPTIM, "warmup_steps": 1})
    trainer = L.Trainer(max_steps=3, precision=precision, gradient_clip_val=1.0, accelerator="cpu",
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    before = [p.detach().clone() for p in module.parameters()]
    trainer.fit(module, torch.utils.data.DataLoader([batch()] * 3, batch_size=None))
    assert trainer.global_step == 3
    assert bool(trainer.optimizers[0].defaults["fused"]) == (precision == "32-true")
    assert any(not torch.equal(a, b) for a, b in zip(before, module.parameters()))


def test_a_training_step_reads_no_scalar_from_the_device(monkeypatch):
    """A scalar read (``.item()``, ``int()``, a metric's NaN check) or a boolean index is a host sync on a
    GPU: the training step and its metrics' updates make none."""
    monkeypatch.setattr("bert_repro.speed.kernels.eager_cpu", lambda x: False)  # as on a GPU
    module = PretrainModule(model=TINY, optim=OPTIM)
    module._step(batch(), "train")  # metrics initialised
    with ScalarReads() as reads:
        module.training_step(batch(seed=1), 0).backward()
    assert reads.ops == [], reads.ops


def test_length_buckets_leave_the_pretraining_loss_as_it_was():
    """speed.length_bucket in pre-training: instances padded up to the bucket (a few shapes for a compiled
    step), their padding masked: the same loss as padded to the longest."""
    from bert_repro.data.pretraining import PretrainingCollator

    g = torch.Generator().manual_seed(0)
    examples = [{"input_ids": [2, *torch.randint(5, 64, (n,), generator=g).tolist(), 3],
                 "token_type_ids": [0] * (n + 2), "next_sentence_label": n % 2,
                 "masked_lm_positions": [1, 2], "masked_lm_ids": [7, 9]} for n in (5, 11, 17)]
    mask = {"max_predictions": 3}
    longest = PretrainingCollator(mask, dynamic=False, nsp=True, seed=0)(examples)
    bucketed = PretrainingCollator(mask, dynamic=False, nsp=True, seed=0, bucket=8, max_length=32)(examples)
    assert longest["input_ids"].shape[1] == 19 and bucketed["input_ids"].shape[1] == 24
    module = PretrainModule(model=TINY, optim=OPTIM).eval()
    with torch.no_grad():
        torch.testing.assert_close(module._step(longest, "val"), module._step(bucketed, "val"))


@pytest.mark.parametrize("ltr", [False, True])
def test_keeping_every_position_gives_the_loss_and_accuracy_of_picking_the_real_ones(monkeypatch, ltr):
    """Off the eager CPU the step scores all B x P positions, the padded ones ignored, instead of picking the
    N real ones out (a host sync): the same loss, gradients and accuracy."""
    from bert_repro.speed import kernels

    torch.manual_seed(0)
    model = {**TINY, "causal": True} if ltr else TINY
    module = PretrainModule(model=model, optim=OPTIM, nsp=not ltr, ltr=ltr)
    b = batch()
    results = []
    for eager in (True, False):
        monkeypatch.setattr(kernels, "eager_cpu", lambda x, eager=eager: eager)
        module.zero_grad()
        module.train_mlm_acc.reset()
        loss = module._step(b, "train")
        loss.backward()
        grads = [p.grad.clone() for p in module.parameters() if p.grad is not None]
        results.append((loss.detach(), grads, module.train_mlm_acc.compute()))
    (picked, picked_grads, picked_acc), (kept, kept_grads, kept_acc) = results
    torch.testing.assert_close(kept, picked)
    torch.testing.assert_close(kept_acc, picked_acc)
    for a, b_ in zip(kept_grads, picked_grads, strict=True):
        torch.testing.assert_close(a, b_)
