"""Scores computed from results.json's numbers, without torch: the table collector imports only these."""

from __future__ import annotations

import math

COLLAPSE_SHARE = 0.99  # a run predicting one class for this share of dev examples has collapsed


def glue_score(scores: dict[str, float | None]) -> float | None:
    """The "Average" column of Table 1: the mean of the nine numbers (MNLI-m and MNLI-mm count apart; QQP and
    MRPC F1, STS-B Spearman, CoLA MCC, the rest accuracy), WNLI excluded. None while any is missing."""
    columns = ("mnli_m", "mnli_mm", "qqp", "qnli", "sst2", "cola", "stsb", "mrpc", "rte")
    values = [scores.get(c) for c in columns]
    if any(v is None or not math.isfinite(v) for v in values):
        return None
    return sum(values) / len(values)


def degenerate_reason(final: dict[str, float | None], collapse_share: float = COLLAPSE_SHARE) -> str | None:
    """Why a run's final dev metrics look degenerate (the majority-class collapse of §4.1's unstable
    fine-tuning runs), or None. Classification: one class predicted for ``collapse_share`` of a dev set;
    regression: constant predictions, which leave the correlations undefined (NaN, stored as None)."""
    for name, value in final.items():
        if name.endswith("top_class_share") and value is not None and value >= collapse_share:
            return f"{name}={value:.3f}: predicts one class for (nearly) every dev example"
        if name.endswith(("pearson", "spearman")) and name.startswith("val/") and value is None:
            return f"{name} undefined: constant predictions"
    return None
