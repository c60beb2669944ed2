"""The benchmark compares like with like: with the same weights, our step and the transformers reference
compute the same loss for every objective (timing itself is the script's business, not a test's)."""

import pytest
import torch

from bert_repro.benchmarks.train_step import REFERENCE, make_batch, our_step, their_step
from bert_repro.convert import hf_config, ours_to_hf
from bert_repro.model import BertConfig, BertForPreTraining


@pytest.mark.parametrize("objective", sorted(REFERENCE))
@pytest.mark.slow
def test_both_sides_compute_the_same_loss(objective):
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    config = BertConfig(vocab_size=1200, hidden_size=64, num_layers=2, num_heads=4, causal=objective == "ltr")
    torch.manual_seed(0)
    ours = BertForPreTraining(config, nsp=objective == "mlm_nsp").eval()
    hf_kwargs = {k: v for k, v in hf_config(config, REFERENCE[objective]).items()
                 if not k.startswith("bert_repro")}
    theirs = getattr(transformers, REFERENCE[objective])(transformers.BertConfig(**hf_kwargs,
                                                                                 attn_implementation="sdpa"))
    missing, unexpected = theirs.load_state_dict(ours_to_hf(ours.state_dict()), strict=False)
    assert not [k for k in missing if "predictions.decoder." not in k]  # only the tied decoder is not stored
    assert all(k.startswith("bert.pooler") for k in unexpected)  # MaskedLM/LMHead models have no pooler
    b = make_batch(config, batch=4, seq=32, masked=5, device="cpu", pairs=objective == "mlm_nsp")
    with torch.no_grad():
        torch.testing.assert_close(our_step(ours, b, objective), their_step(theirs.eval(), b, objective),
                                   atol=1e-4, rtol=1e-4)


@pytest.mark.slow
def test_real_lengths_pad_to_the_longest_and_keep_the_loss():
    """--lengths: a batch of real row lengths is padded to its longest, each row predicts the released
    min(masked, 15 %) positions, and the reference and our unpadded path score it as our padded path does."""
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    from bert_repro.speed import SpeedOptions

    config = BertConfig(vocab_size=1200, hidden_size=64, num_layers=2, num_heads=4)
    b = make_batch(config, batch=4, seq=64, masked=5, device="cpu", lengths=[9, 40, 20, 5])
    assert b["input_ids"].shape == (4, 40)
    assert b["attention_mask"].sum(1).tolist() == [9, 40, 20, 5]
    assert b["predicted"].sum(1).tolist() == [1, 5, 3, 1]
    assert ((b["labels"] != -100).sum(1) == b["predicted"].sum(1)).all()
    losses = []
    for unpad in (False, True):
        torch.manual_seed(0)
        model = BertForPreTraining(config, speed=SpeedOptions(unpad=unpad)).eval()
        with torch.no_grad():
            losses.append(our_step(model, b))
    hf_kwargs = {k: v for k, v in hf_config(config, "BertForPreTraining").items()
                 if not k.startswith("bert_repro")}
    theirs = transformers.BertForPreTraining(transformers.BertConfig(**hf_kwargs, attn_implementation="sdpa"))
    theirs.load_state_dict(ours_to_hf(model.state_dict()), strict=False)
    with torch.no_grad():
        losses.append(their_step(theirs.eval(), b))
    torch.testing.assert_close(losses[1], losses[0], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(losses[2], losses[0], atol=1e-4, rtol=1e-4)


@pytest.mark.slow
def test_the_profile_counts_a_steps_operators():
    """--profile: the ATen operators one training step dispatches, the same per step over 1 or 2 steps after a
    first one, those called from Python among them, and the top entries by time, longest first (on CPU no
    kernels)."""
    from bert_repro.benchmarks.train_step import profile, timed

    config = BertConfig(vocab_size=1200, hidden_size=32, num_layers=1, num_heads=4)  # make_batch: ids >= 1000
    torch.manual_seed(0)
    model = BertForPreTraining(config).train()
    b = make_batch(config, batch=2, seq=16, masked=3, device="cpu")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    timed(lambda: our_step(model, b), optimizer, "cpu")  # the optimizer's state is made in its first step
    one, two = (profile(lambda: our_step(model, b), optimizer, "cpu", "fp32", steps=n, top=5) for n in (1, 2))
    assert one["aten_ops_per_step"] == two["aten_ops_per_step"] > one["outer_aten_ops_per_step"] > 50
    assert one["kernels_per_step"] == 0 and len(one["top"]) == 5
    times = [t["ms_per_step"] for t in one["top"]]
    assert times == sorted(times, reverse=True)
