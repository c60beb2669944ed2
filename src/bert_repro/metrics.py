"""Task metrics as torchmetrics objects, which keep sums / predictions per rank and synchronise them at
``compute`` (so a DDP run scores its whole dev set), plus the GLUE score and the degenerate-run rule."""

from __future__ import annotations

import math
import warnings

from torchmetrics import Metric, MetricCollection
from torchmetrics.classification import BinaryF1Score, MatthewsCorrCoef, MulticlassAccuracy
from torchmetrics.regression import PearsonCorrCoef, SpearmanCorrCoef

# The GLUE metrics by the names the task table and the logged keys use (§4.1, Table 1). F1 and MCC are
# of the positive class 1 (MRPC "equivalent", QQP "duplicate", CoLA "acceptable"), as GLUE scores them.
GLUE_METRICS = {
    "acc": lambda num_labels: MulticlassAccuracy(num_classes=num_labels, average="micro"),
    "f1": lambda num_labels: BinaryF1Score(),
    "mcc": lambda num_labels: MatthewsCorrCoef(task="binary"),
    "pearson": lambda num_labels: PearsonCorrCoef(),
    "spearman": lambda num_labels: SpearmanCorrCoef(),
}

COLLAPSE_SHARE = 0.99  # a run predicting one class for this share of dev examples has collapsed


def glue_metrics(names: tuple[str, ...] | list[str], num_labels: int, prefix: str) -> MetricCollection:
    """``prefix + name`` -> metric, e.g. ``val/mnli_m_acc``. Classification metrics take class ids."""
    unknown = [n for n in names if n not in GLUE_METRICS]
    if unknown:
        raise ValueError(f"unknown metric(s) {unknown}; expected some of {sorted(GLUE_METRICS)}")
    with warnings.catch_warnings():  # "Spearman keeps every prediction": GLUE dev sets are at most 10k rows
        warnings.filterwarnings("ignore", message=".*will save all targets and predictions")
        metrics: dict[str, Metric] = {name: GLUE_METRICS[name](num_labels) for name in names}
    return MetricCollection(metrics, prefix=prefix)


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
