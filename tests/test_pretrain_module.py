"""PretrainModule: the objective, the optimizer recipe, and that the loss really falls."""

import pytest
import torch

from bert_repro.tasks.base import decay_groups, linear_warmup_decay
from bert_repro.tasks.pretrain import PretrainModule

TINY = dict(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4, hidden_dropout=0.0, attention_dropout=0.0)
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
    opt = torch.optim.AdamW(module.parameters(), lr=3e-3)
    losses = []
    for _ in range(steps):
        loss = module._step(b, "train")
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.fixture(autouse=True)
def _no_lightning_log(monkeypatch):
    monkeypatch.setattr(PretrainModule, "log", lambda *a, **k: None)
    monkeypatch.setattr(PretrainModule, "log_dict", lambda *a, **k: None)


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
        out = module.model(b["input_ids"], b["token_type_ids"], b["attention_mask"])  # logits at every position
        keep = b["masked_lm_weights"] > 0
        logits = out.mlm_logits.gather(1, b["masked_lm_positions"][..., None].expand(-1, -1, 64))[keep]
        expected = (torch.nn.functional.cross_entropy(logits, b["masked_lm_ids"][keep])
                    + torch.nn.functional.cross_entropy(out.nsp_logits, b["next_sentence_labels"]))
    torch.testing.assert_close(loss, expected)


def test_no_nsp_has_no_nsp_head():
    module = PretrainModule(model=TINY, optim=OPTIM, nsp=False)
    assert module.model.nsp is None and not any(k.startswith("nsp") for k in module.model.state_dict())


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
