"""speed.compile=true: the training step's forward and loss trace as one graph, with no graph break (so
AOTAutograd compiles its backward as one graph too), for pre-training and a fine-tuning family, padded and
unpadded. The CPU kernels (dropout masks, the fused loss) step aside while compiling: their in-place draws
and data-dependent loops would break it."""

import pytest
import torch
import torch._dynamo
import torch.nn.functional as F

from bert_repro.heads import SequenceClassifier
from bert_repro.model import BertConfig, BertForPreTraining
from bert_repro.speed import DYNAMO, SpeedOptions

# dropout on (the paper's 0.1); narrower than the batch's 12 prediction slots, so that the compiler cannot
# tell from the shapes alone whether the N real predictions outnumber the hidden units (speed/loss.py decode)
CONFIG = dict(vocab_size=300, hidden_size=8, num_layers=2, num_heads=2)


def _batch():
    lengths = torch.tensor([24, 17, 11, 5])
    mask = (torch.arange(24)[None] < lengths[:, None]).long()  # padded: the mask is data
    ids = torch.randint(5, 300, (4, 24), generator=torch.Generator().manual_seed(0)) * mask
    positions = torch.tensor([[1, 2, 3], [2, 5, 9], [1, 4, 0], [3, 0, 0]])
    return ids, mask, positions, positions > 0  # the empty prediction slots read [CLS], unscored


def _explain(step, *args):
    torch._dynamo.reset()
    with torch._dynamo.config.patch(DYNAMO):
        return torch._dynamo.explain(step)(*args)


@pytest.mark.parametrize("speed", [{}, {"fast_kernels": True}])
def test_the_pretraining_step_is_one_graph(speed):
    """PretrainModule's calls: the model at the masked positions, then the MLM + NSP cross-entropy."""
    model = BertForPreTraining(BertConfig(**CONFIG), speed=SpeedOptions(**speed)).train()
    ids, mask, positions, real = _batch()

    def step(ids, mask, positions, real, nsp_labels):
        targets = ids.gather(1, positions)[real]  # (N,)
        out = model(ids, None, mask, masked_positions=positions, prediction_mask=real, mlm_targets=targets)
        mlm = out.mlm_loss if out.mlm_loss is not None else F.cross_entropy(out.mlm_logits.float(), targets)
        return mlm + F.cross_entropy(out.nsp_logits.float(), nsp_labels)

    explained = _explain(step, ids, mask, positions, real, torch.tensor([0, 1, 1, 0]))
    assert explained.graph_break_count == 0, [r.reason for r in explained.break_reasons]
    assert explained.graph_count == 1


@pytest.mark.parametrize("speed", [{}, {"fast_kernels": True}, {"fast_kernels": True, "unpad": True}])
def test_the_classification_step_is_one_graph(speed):
    model = SequenceClassifier(BertConfig(**CONFIG), 2, speed=SpeedOptions(**speed)).train()
    ids, mask, _, _ = _batch()

    def step(ids, mask, labels):
        return F.cross_entropy(model(ids, None, mask), labels)

    explained = _explain(step, ids, mask, torch.tensor([0, 1, 1, 0]))
    assert explained.graph_break_count == 0, [r.reason for r in explained.break_reasons]
    assert explained.graph_count == 1


def test_the_layout_reads_no_mask_value_off_the_eager_cpu():
    """On an accelerator a read of the mask's values is a host sync inside the step: the meta device, which
    has no values to read, stands in for it: the padding mask is built whatever it holds."""
    from bert_repro.speed.layout import attention_mask_for_sdpa

    full = torch.ones(2, 4, dtype=torch.long)
    assert attention_mask_for_sdpa(full.to("meta"), False, 4).shape == (2, 1, 1, 4)
    assert attention_mask_for_sdpa(full, False, 4) is None  # the eager CPU looks: nothing to mask
