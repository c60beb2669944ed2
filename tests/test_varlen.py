"""Unpadding on torch's own varlen flash attention (speed/kernels.py ``flash_varlen``): the adapter speaks
each torch's signature (``is_causal`` in 2.10, ``window_size`` from 2.11), keeps the paper's attention dropout
through the ATen op under varlen_attn, and the unpadded layout (cu_seqlens, unpad/pad) gives the padded path's
loss and gradients. On CPU per-sequence SDPA stands in for the flash kernel; on CUDA the real one runs."""

import inspect
import statistics

import pytest
import torch
import torch.nn.functional as F

from bert_repro.heads import SequenceClassifier
from bert_repro.model import BertConfig
from bert_repro.speed import SpeedOptions, kernels

CUDA = torch.cuda.is_available() and kernels.varlen_attn is not None


def _per_sequence(q, k, v, cu_q, cu_k, dropout_p: float, causal: bool):
    """Attention within each packed sequence by plain SDPA, one sequence at a time: what flash computes."""
    out = []
    for s in range(len(cu_q) - 1):
        qs, ks, vs = (x[c[s]:c[s + 1]].transpose(0, 1) for x, c in ((q, cu_q), (k, cu_k), (v, cu_k)))
        out.append(F.scaled_dot_product_attention(qs, ks, vs, dropout_p=dropout_p, is_causal=causal)
                   .transpose(0, 1))  # (L, heads, d)
    return torch.cat(out)


def _torch_2_10(calls):
    def varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, is_causal=False):
        calls.append(("varlen_attn", {"is_causal": is_causal}))
        return _per_sequence(query, key, value, cu_seq_q, cu_seq_k, 0.0, is_causal)

    return varlen_attn


def _torch_2_11(calls):
    def varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
                    window_size=(-1, -1)):
        calls.append(("varlen_attn", {"window_size": window_size}))
        return _per_sequence(query, key, value, cu_seq_q, cu_seq_k, 0.0, window_size == (-1, 0))

    return varlen_attn


def _flash_forward(calls):
    def forward(q, k, v, cu_q, cu_k, max_q, max_k, dropout_p, is_causal, return_debug_mask):
        calls.append(("_flash_attention_forward", {"dropout_p": dropout_p, "is_causal": is_causal}))
        out = _per_sequence(q, k, v, cu_q, cu_k, dropout_p, is_causal)
        return out, None, None, None, None

    return forward


def _stand_in(monkeypatch, varlen_attn, calls) -> None:
    """The flash kernel and the ATen op under it stood in for on CPU, where the backend is taken as flash."""
    monkeypatch.setattr(kernels, "varlen_attn", varlen_attn)
    monkeypatch.setattr(kernels, "FLASH_FORWARD", _flash_forward(calls))
    monkeypatch.setattr(kernels, "varlen_backend", lambda requested, q, causal: requested)


def _models(causal: bool, attention_dropout: float = 0.0, device: str = "cpu"):
    config = BertConfig(vocab_size=300, hidden_size=32, num_layers=2, num_heads=4, causal=causal,
                        hidden_dropout=0.0, attention_dropout=attention_dropout, initializer_range=0.2)
    torch.manual_seed(0)
    padded = SequenceClassifier(config, num_labels=3).to(device).train()
    flash = SequenceClassifier(config, 3, speed=SpeedOptions(unpad=True, attention="flash")).to(device)
    flash.load_state_dict(padded.state_dict())
    g = torch.Generator().manual_seed(0)
    lengths = torch.tensor([24, 17, 11, 5])
    mask = (torch.arange(24)[None] < lengths[:, None]).long()
    ids = torch.randint(5, 300, (4, 24), generator=g) * mask
    batch = [t.to(device) for t in (ids, torch.zeros_like(ids), mask, torch.tensor([0, 1, 2, 1]))]
    return padded, flash.train(), batch


def _loss_and_grads(model, ids, types, mask, labels):
    model.zero_grad()
    loss = F.cross_entropy(model(ids, types, mask), labels)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("signature", ["2.10", "2.11+"])
@pytest.mark.parametrize("causal", [False, True])
def test_the_adapter_speaks_each_torchs_varlen_signature(signature, causal, monkeypatch):
    """Without dropout the model calls varlen_attn with the causal switch its torch takes, on the real tokens'
    cu_seqlens; the loss and every gradient are the padded model's."""
    calls = []
    _stand_in(monkeypatch, (_torch_2_10 if signature == "2.10" else _torch_2_11)(calls), calls)
    padded, flash, batch = _models(causal)
    (loss, grads), (got, got_grads) = (_loss_and_grads(m, *batch) for m in (padded, flash))
    switch = ({"is_causal": causal} if signature == "2.10" else
              {"window_size": (-1, 0) if causal else (-1, -1)})
    assert calls == [("varlen_attn", switch)] * 2  # one call a layer
    torch.testing.assert_close(got, loss, atol=1e-5, rtol=1e-5)
    for name in grads:
        torch.testing.assert_close(got_grads[name], grads[name], atol=1e-5, rtol=1e-4, msg=name)


def test_the_real_signature_is_one_the_adapter_knows():
    """This torch's varlen_attn (where it has one) takes the switch the adapter passes."""
    if kernels.varlen_attn is None:
        pytest.skip("torch < 2.10 has no torch.nn.attention.varlen")
    parameters = inspect.signature(kernels.varlen_attn).parameters
    assert "window_size" in parameters or "is_causal" in parameters
    assert list(parameters)[:7] == ["query", "key", "value", "cu_seq_q", "cu_seq_k", "max_q", "max_k"]
    # the ATen op is called positionally: its first ten arguments
    schema = [a.name for a in kernels.FLASH_FORWARD.default._schema.arguments][:10]
    assert schema == ["query", "key", "value", "cum_seq_q", "cum_seq_k", "max_q", "max_k", "dropout_p",
                      "is_causal", "return_debug_mask"]


def test_attention_dropout_goes_through_the_op_that_takes_it(monkeypatch):
    """varlen_attn has no dropout: a training step with the paper's 0.1 runs the ATen flash op with
    dropout_p=0.1, and evaluation varlen_attn."""
    calls = []
    _stand_in(monkeypatch, _torch_2_11(calls), calls)
    _, flash, (ids, types, mask, labels) = _models(causal=False, attention_dropout=0.1)
    flash(ids, types, mask)
    assert calls == [("_flash_attention_forward", {"dropout_p": 0.1, "is_causal": False})] * 2
    calls.clear()
    with torch.no_grad():
        flash.eval()(ids, types, mask)
    assert calls == [("varlen_attn", {"window_size": (-1, -1)})] * 2


def _mean_loss(model, batch, draws: int) -> tuple[float, float]:
    """Mean and standard error of the training loss over ``draws`` dropout masks."""
    ids, types, mask, labels = batch
    with torch.no_grad():
        losses = [float(F.cross_entropy(model(ids, types, mask), labels)) for _ in range(draws)]
    return statistics.fmean(losses), statistics.stdev(losses) / draws ** 0.5


@pytest.mark.slow
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not CUDA, reason="torch's varlen flash attention runs on CUDA only"))])
def test_unpadded_attention_dropout_keeps_the_losss_expectation(device, monkeypatch):
    """Dropout draws differ between the paths, so their losses are compared in expectation: over 200 masks the
    unpadded flash path's mean training loss is the padded SDPA path's, and so is the spread of the losses
    from one mask to the next (none without dropout, more at a higher rate). On CPU the flash op is
    per-sequence SDPA."""
    if device == "cpu":
        _stand_in(monkeypatch, _torch_2_11([]), [])
    padded, flash, batch = _models(causal=False, attention_dropout=0.1, device=device)
    with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):  # flash: half precision
        torch.manual_seed(1)
        (mean, se), (got, got_se) = (_mean_loss(m, batch, 200) for m in (padded, flash))
    assert abs(got - mean) < 4 * (se ** 2 + got_se ** 2) ** 0.5, (got, mean, se, got_se)
    assert 0.75 < got_se / se < 1.33, (got_se, se)  # the standard deviation is known to about 5 %


@pytest.mark.skipif(not CUDA, reason="torch's varlen flash attention runs on CUDA only")
@pytest.mark.parametrize("causal", [False, True])
def test_flash_on_cuda_gives_the_padded_loss_and_gradients(causal):
    """The real kernel: bf16 autocast, no dropout; the unpadded model's loss and gradients are the padded
    SDPA model's within bf16 rounding."""
    padded, flash, batch = _models(causal, device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        (loss, grads), (got, got_grads) = (_loss_and_grads(m, *batch) for m in (padded, flash))
    torch.testing.assert_close(got, loss, atol=2e-2, rtol=2e-2)
    for name in grads:
        torch.testing.assert_close(got_grads[name], grads[name], atol=5e-2, rtol=5e-2, msg=name)


def test_flash_where_it_cannot_run_is_refused_with_what_it_needs():
    config = BertConfig(vocab_size=300, hidden_size=32, num_layers=1, num_heads=4)
    model = SequenceClassifier(config, 3, speed=SpeedOptions(unpad=True, attention="flash"))
    ids = torch.tensor([[5, 6, 7, 0]])
    with pytest.raises(ValueError, match=r"speed.attention=flash .* needs CUDA, torch >= 2.10 and bf16"):
        model(ids, None, (ids > 0).long())
