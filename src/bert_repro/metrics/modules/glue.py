"""GLUE's dev metrics (§4.1) of one task, ``evaluate.load(<this file>, "mrpc")``: predictions are class ids
(scores for STS-B), references the labels; the keys are the task's metrics in glue_tasks.yaml (acc, f1,
mcc, pearson, spearman). MNLI's two dev sets are scored one at a time, as the run's mnli_m_ and mnli_mm_."""

import datasets
import evaluate
import torch

from bert_repro.data.glue import glue_task
from bert_repro.metrics.glue import glue_metrics

CITATION = """@inproceedings{wang2019glue, title={{GLUE}: A Multi-Task Benchmark and Analysis Platform for
Natural Language Understanding}, author={Wang, Alex and Singh, Amanpreet and Michael, Julian and Hill, Felix
and Levy, Omer and Bowman, Samuel R.}, booktitle={ICLR}, year={2019}}"""


class Glue(evaluate.Metric):
    def _info(self) -> evaluate.MetricInfo:
        value = datasets.Value("float32" if glue_task(self.config_name).num_labels == 1 else "int64")
        return evaluate.MetricInfo(description=__doc__, citation=CITATION, inputs_description=__doc__,
                                   features=datasets.Features({"predictions": value, "references": value}))

    def _compute(self, predictions: list, references: list) -> dict[str, float]:
        spec = glue_task(self.config_name)
        dtype = torch.float32 if spec.num_labels == 1 else torch.long
        scores = glue_metrics(spec.metrics, spec.num_labels, prefix="")(
            torch.tensor(predictions, dtype=dtype), torch.tensor(references, dtype=dtype))
        return {name: float(value) for name, value in scores.items()}
