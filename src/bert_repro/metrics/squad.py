"""The official SQuAD scoring (§4.2; v2 §4.3): evaluate-v1.1.py and evaluate-v2.0.py, and Dev's null
threshold as the paper reports v2.0 Dev.

Answers are lower-cased, stripped of punctuation, articles and extra whitespace; EM and token F1 take the
maximum over the gold answers. v1.1 goes through torchmetrics' SQuAD metric; v2.0's no-answer scoring
(HasAns / NoAns, best_f1 and its threshold) follows evaluate-v2.0.py line for line. ``score_v2`` predicts ""
where the null odds s_null - s_best exceed tau, the Dev threshold maximising F1 (best_f1_thresh), and
reports exact_match / f1 at tau (so f1 = best_f1).
"""

from __future__ import annotations

import collections
import re
import string

import numpy as np
from torchmetrics.text import SQuAD

PUNCTUATION = set(string.punctuation)


def normalize_answer(s: str) -> str:
    """Lower text and remove punctuation, articles and extra whitespace."""
    s = "".join(ch for ch in s.lower() if ch not in PUNCTUATION)
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def exact_score(gold: str, pred: str) -> int:
    return int(normalize_answer(gold) == normalize_answer(pred))


def f1_score(gold: str, pred: str) -> float:
    """Token F1 of the normalised answers; a no-answer ("") scores 1 against a no-answer, else 0."""
    gold_tokens, pred_tokens = normalize_answer(gold).split(), normalize_answer(pred).split()
    if not gold_tokens or not pred_tokens:
        return float(gold_tokens == pred_tokens)
    same = sum((collections.Counter(gold_tokens) & collections.Counter(pred_tokens)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred_tokens), same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def evaluate_v1(answers: dict[str, list[str]], preds: dict[str, str]) -> dict[str, float]:
    """exact_match and f1 (0-100) of evaluate-v1.1.py, through torchmetrics' SQuAD metric."""
    metric = SQuAD(sync_on_compute=False)  # every rank scores the whole (gathered) dev set itself
    metric.update([{"prediction_text": preds[q], "id": q} for q in answers],
                  [{"answers": {"text": texts, "answer_start": [0] * len(texts)}, "id": q}
                   for q, texts in answers.items()])
    return {name: float(value) for name, value in metric.compute().items()}


def _eval_dict(exact: dict[str, float], f1: dict[str, float], qids: list[str]) -> dict[str, float]:
    return {"exact": 100.0 * sum(exact[q] for q in qids) / len(qids),
            "f1": 100.0 * sum(f1[q] for q in qids) / len(qids), "total": len(qids)}


def _best_threshold(preds: dict[str, str], scores: dict[str, float], na_probs: dict[str, float],
                    has_ans: dict[str, bool]) -> tuple[float, float]:
    """evaluate-v2.0.py's find_best_thresh: start from all-null, then answer the questions in increasing
    na_prob order; the best running score and the na_prob where it was reached."""
    cur_score = best_score = sum(1 for q in has_ans if not has_ans[q])
    best_thresh = 0.0
    for qid in sorted(na_probs, key=lambda k: na_probs[k]):
        if qid not in scores:
            continue
        if has_ans[qid]:
            diff = scores[qid]
        else:
            diff = -1 if preds[qid] else 0
        cur_score += diff
        if cur_score > best_score:
            best_score, best_thresh = cur_score, na_probs[qid]
    return 100.0 * best_score / len(scores), best_thresh


def evaluate_v2(answers: dict[str, list[str]], preds: dict[str, str],
                na_probs: dict[str, float] | None = None, na_prob_thresh: float = 1.0) -> dict[str, float]:
    """evaluate-v2.0.py: exact, f1, total, HasAns_* and NoAns_* (where such questions exist) and, given
    ``na_probs`` (null odds), best_exact / best_f1 with their thresholds. ``answers``: qid -> gold texts
    ([] when unanswerable). A question with na_prob > na_prob_thresh counts as answered with null."""
    has_ans = {q: bool(texts) for q, texts in answers.items()}
    exact_raw, f1_raw = {}, {}
    for qid, texts in answers.items():
        if qid not in preds:
            continue
        golds = [t for t in texts if normalize_answer(t)] or [""]
        exact_raw[qid] = max(exact_score(g, preds[qid]) for g in golds)
        f1_raw[qid] = max(f1_score(g, preds[qid]) for g in golds)
    probs = na_probs if na_probs is not None else {q: 0.0 for q in preds}
    exact_thresh, f1_thresh = dict(exact_raw), dict(f1_raw)
    for qid in exact_raw:
        if probs[qid] > na_prob_thresh:
            exact_thresh[qid] = f1_thresh[qid] = float(not has_ans[qid])
    out = _eval_dict(exact_thresh, f1_thresh, list(exact_thresh))
    for prefix, wanted in (("HasAns", True), ("NoAns", False)):
        qids = [q for q in exact_thresh if has_ans[q] == wanted]
        if qids:
            out.update({f"{prefix}_{k}": v for k, v in _eval_dict(exact_thresh, f1_thresh, qids).items()})
    if na_probs is not None:
        out["best_exact"], out["best_exact_thresh"] = _best_threshold(preds, exact_raw, na_probs, has_ans)
        out["best_f1"], out["best_f1_thresh"] = _best_threshold(preds, f1_raw, na_probs, has_ans)
    return out


def features(**predicted):
    """The evaluate modules' inputs: a prediction's id and text with ``predicted`` (v2.0's null odds), and
    references as the data set holds them."""
    import datasets  # the evaluate modules' alone: a run scores without it

    text = datasets.Value("string")
    answers = datasets.Sequence({"text": text, "answer_start": datasets.Value("int32")})
    return datasets.Features({"predictions": {"id": text, "prediction_text": text, **predicted},
                              "references": {"id": text, "answers": answers}})


def questions(predictions: list[dict],
              references: list[dict]) -> tuple[dict[str, list[str]], dict[str, dict]]:
    """The ``evaluate`` modules' rows by question: id -> gold texts, id -> prediction; the ids must agree."""
    answers = {r["id"]: r["answers"]["text"] for r in references}
    predicted = {p["id"]: p for p in predictions}
    if predicted.keys() != answers.keys():
        raise ValueError(f"{len(predicted.keys() - answers.keys())} predicted id(s) without a reference and "
                         f"{len(answers.keys() - predicted.keys())} reference id(s) without a prediction; "
                         "expected one prediction per question")
    return answers, predicted


def score_v2(answers: dict[str, list[str]], texts: dict[str, str],
             null_odds: dict[str, float]) -> tuple[dict[str, float], dict[str, str]]:
    """v2.0 Dev as the paper reports it, from each question's best non-null text and its null odds: the
    metrics (val/ names without the prefix, tau as null_threshold) and the answers at tau."""
    tuned = evaluate_v2(answers, texts, null_odds)
    tau = tuned["best_f1_thresh"]
    if tuned["best_f1"] <= 100.0 * sum(not golds for golds in answers.values()) / len(answers):
        # no answer beats "no answer" anywhere: evaluate-v2.0.py reports 0.0, but the tau that predicts
        # null for every question is the one just below the lowest null odds
        tau = float(np.nextafter(np.float32(min(null_odds.values())), np.float32(-np.inf)))
    final = {q: text if null_odds[q] <= tau else "" for q, text in texts.items()}
    at_tau = evaluate_v2(answers, final)
    metrics = {"exact_match": at_tau["exact"], "f1": at_tau["f1"],
               **{f"{split}_{m}": at_tau[f"{prefix}_{m}"] for split, prefix in (("has_ans", "HasAns"),
                                                                                ("no_ans", "NoAns"))
                  for m in ("exact", "f1") if f"{prefix}_{m}" in at_tau},
               **{k: tuned[k] for k in ("best_exact", "best_exact_thresh", "best_f1", "best_f1_thresh")},
               "null_threshold": tau}
    return metrics, final
