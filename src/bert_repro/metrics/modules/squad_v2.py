"""SQuAD v2.0 Dev as the paper reports it (v2 §4.3): predictions ``{"id", "prediction_text", "null_odds"}``,
each question's best non-null span and its null odds s_null - s_best (the run's null_odds.json), references
``{"id", "answers": {"text", "answer_start"}}`` (no text: unanswerable). The threshold tau that maximises
F1 is tuned on these questions; exact_match, f1, has_ans_* and no_ans_* are those at tau, with
evaluate-v2.0.py's best_exact / best_f1 and their thresholds, and tau as null_threshold."""

import datasets
import evaluate

from bert_repro.metrics.squad import features, questions, score_v2

CITATION = """@inproceedings{rajpurkar2018know, title={Know What You Don't Know: Unanswerable Questions for
{SQuAD}}, author={Rajpurkar, Pranav and Jia, Robin and Liang, Percy}, booktitle={ACL}, year={2018}}"""


class SquadV2(evaluate.Metric):
    def _info(self) -> evaluate.MetricInfo:
        return evaluate.MetricInfo(description=__doc__, citation=CITATION, inputs_description=__doc__,
                                   features=features(null_odds=datasets.Value("float64")))

    def _compute(self, predictions: list[dict], references: list[dict]) -> dict[str, float]:
        answers, predicted = questions(predictions, references)
        return score_v2(answers, {q: p["prediction_text"] for q, p in predicted.items()},
                        {q: p["null_odds"] for q, p in predicted.items()})[0]
