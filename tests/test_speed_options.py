"""Speed options change how fast a step runs, never what it computes (issue #8 §3): unpadding and
activation checkpointing give the same loss and gradients as the plain padded pass; the MFU formula
counts what the paper's encoder does."""

import pytest
import torch
import torch.nn.functional as F

from bert_repro.flops import encoder_parameters, training_flops
from bert_repro.heads import SequenceClassifier
from bert_repro.model import BertConfig, BertForPreTraining, BertModel, count_parameters


def _batch(config: BertConfig, B: int = 4, T: int = 24, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([T, T - 7, T - 13, 5])[:B]
    mask = (torch.arange(T)[None] < lengths[:, None]).long()
    ids = torch.randint(5, config.vocab_size, (B, T), generator=g) * mask
    types = (torch.arange(T)[None] >= lengths[:, None] // 2).long() * mask
    positions = torch.stack([1 + torch.randperm(int(n) - 1, generator=g)[:3].sort().values for n in lengths])
    return ids, types, mask, positions


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _pretrain_loss(model, ids, types, mask, positions, ltr: bool):
    if ltr:
        B, T = ids.shape
        positions, real = torch.arange(T - 1).expand(B, -1), mask[:, 1:].bool()
        targets = ids[:, 1:][real]
    else:
        real = torch.ones_like(positions, dtype=torch.bool)
        targets = ids.gather(1, positions)[real]
    out = model(ids, types, mask, masked_positions=positions, prediction_mask=real)
    loss = F.cross_entropy(out.mlm_logits, targets)
    if out.nsp_logits is not None:
        loss = loss + F.cross_entropy(out.nsp_logits, torch.tensor([0, 1, 1, 0]))
    return loss


@pytest.mark.parametrize("option", ["unpad", "checkpointing"])
@pytest.mark.parametrize("ltr", [False, True])
def test_pretraining_loss_and_gradients_unchanged(option, ltr):
    config = BertConfig(vocab_size=300, hidden_size=32, num_layers=3, num_heads=4, causal=ltr,
                        hidden_dropout=0.0, attention_dropout=0.0)
    torch.manual_seed(0)
    model = BertForPreTraining(config, nsp=not ltr).train()
    batch = _batch(config)
    assert not bool(batch[2].all())  # padded: unpadding has something to remove
    reference = _pretrain_loss(model, *batch, ltr)
    reference.backward()
    expected = _grads(model)
    model.zero_grad()
    setattr(model.bert.encoder, option, True)
    rows = []  # what the first feed-forward sees: the real tokens only (N, H) when unpadded
    hook = model.bert.encoder.layer[0].intermediate.register_forward_hook(lambda m, i, o: rows.append(i[0].shape))
    loss = _pretrain_loss(model, *batch, ltr)
    loss.backward()
    hook.remove()
    assert rows[0] == ((int(batch[2].sum()), 32) if option == "unpad" else (4, 24, 32))
    torch.testing.assert_close(loss, reference, atol=1e-5, rtol=1e-5)
    got = _grads(model)
    assert got.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], atol=1e-5, rtol=1e-4, msg=name)


def test_unpadded_sequence_and_hidden_states_match_at_real_tokens():
    config = BertConfig(vocab_size=300, hidden_size=32, num_layers=2, num_heads=4)
    torch.manual_seed(0)
    bert = BertModel(config).eval()
    ids, types, mask, _ = _batch(config)
    with torch.no_grad():
        reference = bert(ids, types, mask, output_hidden_states=True)
        bert.encoder.unpad = True
        out = bert(ids, types, mask, output_hidden_states=True)
    real = mask.bool()
    torch.testing.assert_close(out.last_hidden_state[real], reference.last_hidden_state[real], atol=1e-5, rtol=1e-5)
    for got, expected in zip(out.hidden_states, reference.hidden_states, strict=True):
        torch.testing.assert_close(got[real], expected[real], atol=1e-5, rtol=1e-5)


def test_unpadding_with_dropout_keeps_classifier_training_statistics():
    """With dropout on, the two paths draw different masks; the loss is still a proper, finite loss of
    the same magnitude and the classifier's gradient flows (no position silently dropped)."""
    config = BertConfig(vocab_size=300, hidden_size=32, num_layers=2, num_heads=4)
    torch.manual_seed(0)
    model = SequenceClassifier(config, num_labels=3).train()
    model.bert.encoder.unpad = True
    ids, types, mask, _ = _batch(config)
    loss = F.cross_entropy(model(ids, types, mask), torch.tensor([0, 1, 2, 1]))
    loss.backward()
    assert torch.isfinite(loss) and 0.5 < float(loss.detach()) < 2.5
    assert model.bert.encoder.layer[0].attention.qkv.weight.grad.abs().sum() > 0


def test_encoder_parameters_and_flops_formula():
    base = BertConfig()
    bert = BertModel(base)
    # non-embedding parameters less the embedding LayerNorm and the pooler: the layers themselves
    H = base.hidden_size
    assert encoder_parameters(base) == count_parameters(bert, non_embedding=True) - 2 * H - (H * H + H)
    assert encoder_parameters(base) == 85_054_464
    # 128 real tokens, 20 predictions: 6N per token + attention over 128 keys + the head at 20 positions
    flops = training_flops(base, tokens=128, seq_len=128, predictions=20)
    expected = 128 * (6 * 85_054_464 + 12 * 12 * 128 * 768) + 20 * 6 * (768 * 768 + 768 * 30522)
    assert flops == expected
    assert 5.0e-4 < flops / 128 / 1e12 < 6.0e-4  # ~0.55 GFLOP per token, the usual BERT-base figure
