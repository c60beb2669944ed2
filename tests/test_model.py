"""The encoder's own contract: config validation, initialisation, masking (causal and padding), outputs."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from bert_repro.model import (
    BertConfig,
    BertForPreTraining,
    BertModel,
    count_parameters,
)
from bert_repro.speed.layout import attention_mask_for_sdpa

TINY = dict(vocab_size=101, hidden_size=32, num_layers=3, num_heads=4, max_position=64,
            hidden_dropout=0.0, attention_dropout=0.0)


def tiny_model(seed: int = 0, **overrides) -> BertForPreTraining:
    torch.manual_seed(seed)
    return BertForPreTraining(BertConfig(**{**TINY, **overrides})).eval()


def random_ids(batch: int, seq: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(5, TINY["vocab_size"], (batch, seq), generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------------------------------------ config

def test_config_derives_4h_and_keeps_an_explicit_intermediate():
    assert BertConfig(hidden_size=256, num_heads=4).intermediate_size == 1024
    assert BertConfig(hidden_size=256, num_heads=4, intermediate_size=37).intermediate_size == 37
    assert BertConfig().head_dim == 64


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(hidden_size=100, num_heads=12), r"model.hidden_size=100 is not divisible by model.num_heads"),
        (dict(hidden_size=-768), r"model.hidden_size=-768: expected a positive whole number of units"),
        (dict(num_layers=0), r"model.num_layers=0: expected a positive whole number of layers"),
        (dict(vocab_size=-5), r"model.vocab_size=-5: expected a positive whole number of tokens"),
        (dict(intermediate_size=-1), r"model.intermediate_size=-1: expected a positive whole number"),
        (dict(num_heads=True), r"model.num_heads=True: expected a positive whole number of heads"),
        (dict(hidden_size=76.8), r"model.hidden_size=76.8: expected a positive whole number"),
        (dict(hidden_dropout=1.0), r"model.hidden_dropout=1: expected a fraction in \[0, 1\)"),
        (dict(attention_dropout=-0.1), r"model.attention_dropout=-0.1: expected a fraction in \[0, 1\)"),
        (dict(layer_norm_eps=0.0), r"model.layer_norm_eps=0: expected a positive number"),
    ],
)
def test_config_rejects_inconsistent_values(kwargs, message):
    with pytest.raises(ValueError, match=message):
        BertConfig(**kwargs)


def test_base_has_the_papers_110m_parameters():
    with torch.device("meta"):  # shapes only
        bert = BertModel(BertConfig())
        pretraining = BertForPreTraining(BertConfig())
    assert count_parameters(bert) == 109_482_240  # google-research/bert uncased_L-12_H-768_A-12
    # The tied MLM decoder adds nothing; its head adds dense + LayerNorm + bias, NSP 2H + 2.
    assert (count_parameters(pretraining) - count_parameters(bert)
            == 768 * 768 + 768 + 2 * 768 + 30522 + 768 * 2 + 2)
    assert count_parameters(bert, non_embedding=True) == 109_482_240 - (30522 + 512 + 2) * 768


# ------------------------------------------------------------------------------------------------ init

def test_init_statistics():
    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig(vocab_size=4000, hidden_size=256, num_layers=2, num_heads=4))
    for name, module in model.named_modules():
        if isinstance(module, (nn.Linear, nn.Embedding)):
            assert abs(module.weight.std().item() - 0.02) < 0.002, name
            assert abs(module.weight.mean().item()) < 0.002, name
            if getattr(module, "bias", None) is not None:
                assert torch.all(module.bias == 0), name
        elif isinstance(module, nn.LayerNorm):
            assert torch.all(module.weight == 1) and torch.all(module.bias == 0), name
    assert torch.all(model.mlm.bias == 0)
    wide = BertForPreTraining(BertConfig(vocab_size=4000, hidden_size=256, num_layers=1, num_heads=4,
                                         initializer_range=0.05))
    assert abs(wide.bert.encoder.layer[0].intermediate.weight.std().item() - 0.05) < 0.002


def test_mlm_decoder_is_tied_to_the_word_embeddings():
    model = tiny_model()
    ids = random_ids(2, 9)
    before = model(ids).mlm_logits
    with torch.no_grad():
        model.bert.embeddings.word_embeddings.weight[7] += 1.0
    after = model(ids).mlm_logits
    changed = (after - before).abs().amax(dim=(0, 1)) > 0  # (V,)
    assert changed[7]  # the decoder row of token 7 is the embedding of token 7


# ------------------------------------------------------------------------------------------------ masking

def _hidden(model, ids, mask=None):
    with torch.no_grad():
        return model(ids, attention_mask=mask, output_hidden_states=True)


@pytest.mark.parametrize("padded", [False, True])
def test_causal_outputs_ignore_the_future(padded):
    model = tiny_model(causal=True)
    ids = random_ids(3, 12)
    mask = None
    if padded:
        mask = torch.ones_like(ids)
        mask[1, 9:] = 0
        mask[2, 5:] = 0
    t = 4
    changed = ids.clone()
    changed[:, t + 1:] = torch.randint(5, TINY["vocab_size"], changed[:, t + 1:].shape)
    a, b = _hidden(model, ids, mask), _hidden(model, changed, mask)
    for layer, (x, y) in enumerate(zip(a.hidden_states, b.hidden_states)):
        torch.testing.assert_close(x[:, : t + 1], y[:, : t + 1], rtol=0, atol=0, msg=f"layer {layer}")
    torch.testing.assert_close(a.mlm_logits[:, : t + 1], b.mlm_logits[:, : t + 1], rtol=0, atol=0)
    torch.testing.assert_close(a.nsp_logits, b.nsp_logits, rtol=0, atol=0)  # [CLS] sees only itself
    assert (a.last_hidden_state[0, t + 1:] - b.last_hidden_state[0, t + 1:]).abs().max() > 1e-3

    # The same change reaches the earlier positions of a bidirectional model: the test can fail.
    bidirectional = tiny_model(causal=False)
    a, b = _hidden(bidirectional, ids, mask), _hidden(bidirectional, changed, mask)
    assert (a.last_hidden_state[:, : t + 1] - b.last_hidden_state[:, : t + 1]).abs().max() > 1e-3


@pytest.mark.parametrize("causal", [False, True])
def test_appended_padding_changes_nothing_at_real_positions(causal):
    model = tiny_model(causal=causal)
    ids = random_ids(2, 10)
    padded = torch.cat([ids, torch.zeros(2, 6, dtype=torch.long)], dim=1)
    mask = torch.cat([torch.ones(2, 10, dtype=torch.long), torch.zeros(2, 6, dtype=torch.long)], dim=1)
    a, b = _hidden(model, ids), _hidden(model, padded, mask)
    for layer, (x, y) in enumerate(zip(a.hidden_states, b.hidden_states)):
        torch.testing.assert_close(x, y[:, :10], atol=1e-5, rtol=1e-5, msg=f"layer {layer}")
    torch.testing.assert_close(a.nsp_logits, b.nsp_logits, atol=1e-5, rtol=1e-5)
    # Without the mask the padding is attended to and the outputs move: the mask is doing the work.
    unmasked = _hidden(model, padded)
    if not causal:
        assert (unmasked.last_hidden_state[:, :10] - a.last_hidden_state).abs().max() > 1e-3


def test_attention_mask_for_sdpa():
    assert attention_mask_for_sdpa(None, False, 4) is None
    assert attention_mask_for_sdpa(torch.ones(2, 4, dtype=torch.long), True, 4) is None  # fast path
    pad = torch.tensor([[1, 1, 1, 0]])
    assert attention_mask_for_sdpa(pad, False, 4).tolist() == [[[[True, True, True, False]]]]
    causal = attention_mask_for_sdpa(pad, True, 4)[0, 0]  # (T, T): query row, key column
    assert causal.tolist() == [[True, False, False, False], [True, True, False, False],
                               [True, True, True, False], [True, True, True, False]]
    # the sparse last layer: queries at positions (B, P) only, their rows of the full mask
    positions = torch.tensor([[2, 0]])
    assert attention_mask_for_sdpa(torch.ones(1, 4), False, 4, positions) is None  # nothing to mask
    assert attention_mask_for_sdpa(pad, True, 4, positions)[0, 0].tolist() == [causal[2].tolist(),
                                                                               causal[0].tolist()]
    assert attention_mask_for_sdpa(None, True, 4, positions)[0, 0].tolist() == [[True, True, True, False],
                                                                                 [True, False, False, False]]


# ------------------------------------------------------------------------------------------------ outputs

def test_output_hidden_states_returns_embeddings_and_every_layer():
    model = tiny_model()
    ids = random_ids(2, 7)
    out = _hidden(model, ids)
    assert len(out.hidden_states) == TINY["num_layers"] + 1
    assert all(h.shape == (2, 7, TINY["hidden_size"]) for h in out.hidden_states)
    torch.testing.assert_close(out.hidden_states[-1], out.last_hidden_state, rtol=0, atol=0)
    torch.testing.assert_close(out.hidden_states[0], model.bert.embeddings(ids, torch.zeros_like(ids)))
    assert model(ids).hidden_states is None


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_mlm_logits_at_masked_positions_equal_the_full_logits_there(causal, padded):
    """The sparse last layer (queries only at [CLS] and the positions) is exact, causal or not."""
    model = tiny_model(causal=causal)
    ids = random_ids(3, 12)
    mask = torch.ones_like(ids)
    if padded:
        mask[2, 8:] = 0
    positions = torch.tensor([[0, 3, 11], [5, 5, 1], [2, 7, 0]])  # (B, P); repeats and 0-padding allowed
    with torch.no_grad():
        full = model(ids, attention_mask=mask)  # logits at every position, (B, T, V)
        picked = model(ids, attention_mask=mask, masked_positions=positions)  # (B, P, V)
        real = torch.tensor([[True, True, False], [True, False, True], [True, True, True]])
        flat = model(ids, attention_mask=mask, masked_positions=positions, prediction_mask=real).mlm_logits
    assert picked.mlm_logits.shape == (3, 3, TINY["vocab_size"])
    expected = torch.stack([full.mlm_logits[b, positions[b]] for b in range(3)])
    torch.testing.assert_close(picked.mlm_logits, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(picked.nsp_logits, full.nsp_logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(flat, expected[real], atol=1e-5, rtol=1e-5)  # (N, V)


def test_without_nsp_there_is_no_nsp_head():
    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig(**TINY), nsp=False)
    assert model.nsp is None and not any(k.startswith("nsp.") for k in model.state_dict())
    assert model(random_ids(1, 5)).nsp_logits is None


def test_input_checks():
    model = tiny_model()
    with pytest.raises(ValueError, match="exceeds max_position 64"):
        model(random_ids(1, 65))
    with pytest.raises(ValueError, match=r"shape \(batch, seq_len\)"):
        model(random_ids(1, 5)[0])
