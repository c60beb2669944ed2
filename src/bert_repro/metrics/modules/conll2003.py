"""CoNLL-2003 NER (v1 §4.3) at the entity level, with conlleval's semantics: predictions and references are
sentences of tags (IOB1 or IOB2); precision, recall, f1 and the word-level token_acc."""

import datasets
import evaluate

from bert_repro.metrics.conll import entity_scores

CITATION = """@inproceedings{tjong2003conll, title={Introduction to the {CoNLL}-2003 Shared Task:
Language-Independent Named Entity Recognition}, author={Tjong Kim Sang, Erik F. and De Meulder, Fien},
booktitle={CoNLL}, year={2003}}"""


class Conll2003(evaluate.Metric):
    def _info(self) -> evaluate.MetricInfo:
        tags = datasets.Sequence(datasets.Value("string"))
        return evaluate.MetricInfo(description=__doc__, citation=CITATION, inputs_description=__doc__,
                                   features=datasets.Features({"predictions": tags, "references": tags}))

    def _compute(self, predictions: list[list[str]], references: list[list[str]]) -> dict[str, float]:
        for i, (predicted, gold) in enumerate(zip(predictions, references)):
            if len(predicted) != len(gold):
                raise ValueError(f"sentence {i}: {len(predicted)} predicted tags for {len(gold)} reference "
                                 "tags; expected one per word")
        return entity_scores(references, predictions)
