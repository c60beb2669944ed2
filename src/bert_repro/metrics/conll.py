"""CoNLL-2003's entity-level scores (v1 §4.3) with conlleval's semantics, through seqeval."""

from __future__ import annotations

import numpy as np
from seqeval.metrics import f1_score, precision_score, recall_score
from torch import Tensor
from torchmetrics import Metric
from torchmetrics.utilities import dim_zero_cat


def entity_scores(y_true: list[list[str]], y_pred: list[list[str]]) -> dict[str, float]:
    """Entity-level precision / recall / F1 as conlleval counts them (seqeval's default mode: an I- after O or
    after another type opens a chunk, so IOB1 and IOB2 tags score alike), and word-level accuracy."""
    words = sum(len(s) for s in y_true)
    correct = sum(t == p for st, sp in zip(y_true, y_pred) for t, p in zip(st, sp))
    return {"precision": precision_score(y_true, y_pred, zero_division=0),
            "recall": recall_score(y_true, y_pred, zero_division=0),
            "f1": f1_score(y_true, y_pred, zero_division=0), "token_acc": correct / max(1, words)}


class EntityF1(Metric):
    """``entity_scores`` over whole sentences rebuilt from windows. The (sentence, word, predicted, gold) rows
    are concatenated across ranks, and a word seen twice (a distributed sampler that repeats examples to even
    out the ranks) counts once."""

    full_state_update = False

    def __init__(self, labels: tuple[str, ...]):
        super().__init__()
        self.labels = list(labels)
        for name in ("sentence", "word", "pred", "target"):
            self.add_state(name, default=[], dist_reduce_fx="cat")

    def update(self, sentence: Tensor, word: Tensor, pred: Tensor, target: Tensor) -> None:
        for name, value in (("sentence", sentence), ("word", word), ("pred", pred), ("target", target)):
            getattr(self, name).append(value.long())

    def compute(self) -> dict[str, float]:
        if isinstance(self.sentence, list) and not self.sentence:  # a list until synced, then one tensor
            return {"precision": 0.0, "recall": 0.0, "f1": 0.0, "token_acc": 0.0}
        sentence, word, pred, target = (dim_zero_cat(getattr(self, n)).cpu().numpy()
                                        for n in ("sentence", "word", "pred", "target"))
        # sorted, unique
        keys, first = np.unique(np.stack([sentence, word], axis=1), axis=0, return_index=True)
        cuts = np.flatnonzero(np.diff(keys[:, 0])) + 1
        names = np.asarray(self.labels)
        y_true = [names[t].tolist() for t in np.split(target[first], cuts)]
        y_pred = [names[p].tolist() for p in np.split(pred[first], cuts)]
        return entity_scores(y_true, y_pred)
