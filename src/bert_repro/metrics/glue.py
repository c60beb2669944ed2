"""GLUE's dev metrics (§4.1) as torchmetrics objects, which keep sums / predictions per rank and synchronise
them at ``compute`` (so a DDP run scores its whole dev set)."""

from __future__ import annotations

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

def glue_metrics(names: tuple[str, ...] | list[str], num_labels: int, prefix: str) -> MetricCollection:
    """``prefix + name`` -> metric, e.g. ``val/mnli_m_acc``. Classification metrics take class ids."""
    unknown = [n for n in names if n not in GLUE_METRICS]
    if unknown:
        raise ValueError(f"unknown metric(s) {unknown}; expected some of {sorted(GLUE_METRICS)}")
    with warnings.catch_warnings():  # "Spearman keeps every prediction": GLUE dev sets are at most 10k rows
        warnings.filterwarnings("ignore", message=".*will save all targets and predictions")
        metrics: dict[str, Metric] = {name: GLUE_METRICS[name](num_labels) for name in names}
    return MetricCollection(metrics, prefix=prefix)
