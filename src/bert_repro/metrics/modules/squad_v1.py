"""SQuAD v1.1 (§4.2) as the official evaluate-v1.1.py scores it: predictions ``{"id", "prediction_text"}``
(the run's predictions.json), references ``{"id", "answers": {"text", "answer_start"}}`` as the data set
holds them; exact_match and f1 (0-100)."""

import evaluate

from bert_repro.metrics.squad import evaluate_v1, features, questions

CITATION = """@inproceedings{rajpurkar2016squad, title={{SQuAD}: 100,000+ Questions for Machine Comprehension
of Text}, author={Rajpurkar, Pranav and Zhang, Jian and Lopyrev, Konstantin and Liang, Percy},
booktitle={EMNLP}, year={2016}}"""


class SquadV1(evaluate.Metric):
    def _info(self) -> evaluate.MetricInfo:
        return evaluate.MetricInfo(description=__doc__, citation=CITATION, inputs_description=__doc__,
                                   features=features())

    def _compute(self, predictions: list[dict], references: list[dict]) -> dict[str, float]:
        answers, predicted = questions(predictions, references)
        return evaluate_v1(answers, {q: p["prediction_text"] for q, p in predicted.items()})
