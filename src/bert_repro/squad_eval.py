"""SQuAD post-processing and scoring (§4.2; v2 §4.3), with the semantics of the released run_squad.py and of
the official evaluate-v1.1.py / evaluate-v2.0.py.

Post-processing: in each window the ``n_best_size`` highest start and end logits give candidate spans
(passage tokens only, end >= start, at most ``max_answer_length`` tokens, starting where the token has its
maximum context); a span scores S.T_i + E.T_j and its text is cut out of the original context through
the tokens' character offsets. Across a question's windows the best span wins. v2.0 adds the null answer,
s_null = S.C + E.C (the lowest over the windows, as run_squad.py), and predicts "" when
s_null - s_best > tau; tau is the Dev threshold maximising F1 (``evaluate_v2``'s best_f1_thresh), and
exact_match / f1 are those of the answers at tau (so f1 = best_f1), as the paper reports Dev.

Scoring: answers are lower-cased, stripped of punctuation, articles and extra whitespace; EM and token F1
take the maximum over the gold answers. v1.1 goes through torchmetrics' SQuAD metric; v2.0's no-answer
scoring (HasAns / NoAns, best_f1 and its threshold) follows evaluate-v2.0.py line for line.
"""

from __future__ import annotations

import collections
import json
import math
import re
import string
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from torchmetrics.text import SQuAD

# -- the official answer comparison (evaluate-v2.0.py) ------------------------------------------------
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


# -- from logits to answers (run_squad.py's write_predictions) ---------------------------------------
@dataclass
class WindowLogits:
    """What the model leaves for one window: the top-k start and end positions with their logits, and the
    [CLS] logits (S.C, E.C)."""

    start_index: np.ndarray
    start_logit: np.ndarray
    end_index: np.ndarray
    end_logit: np.ndarray
    null_start: float
    null_end: float


@dataclass
class Window:
    """A window's passage tokens: where they start in the input, their characters, and max-context flags."""

    context_start: int
    offsets: list[tuple[int, int]]
    max_context: list[bool]


@dataclass
class Prediction:
    """One question's n-best list (text, probability, start_logit, end_logit), best non-null text and
    null odds s_null - s_best (v2.0; None for v1.1)."""

    nbest: list[dict] = field(default_factory=list)
    text: str = ""
    null_odds: float | None = None


def window_spans(logits: WindowLogits, window: Window, max_answer_length: int) -> list[tuple[float, int, int,
                                                                                             float, float]]:
    """Valid candidate spans of one window: (score, start_char, end_char, start_logit, end_logit)."""
    first, count = window.context_start, len(window.offsets)
    spans = []
    for s, s_logit in zip(logits.start_index.tolist(), logits.start_logit.tolist()):
        if not first <= s < first + count or not window.max_context[s - first]:
            continue
        for e, e_logit in zip(logits.end_index.tolist(), logits.end_logit.tolist()):
            if not s <= e < first + count or e - s + 1 > max_answer_length:
                continue
            spans.append((s_logit + e_logit, window.offsets[s - first][0], window.offsets[e - first][1],
                          s_logit, e_logit))
    return spans


def predict_question(context: str, windows: list[tuple[WindowLogits, Window]], n_best_size: int,
                     max_answer_length: int, with_null: bool) -> Prediction:
    """The best spans over all of a question's windows, at most ``n_best_size`` distinct texts. with_null
    (v2.0): the null answer ("", the lowest s_null over the windows) is ranked among them and always
    listed."""
    spans = [span for logits, window in windows for span in window_spans(logits, window, max_answer_length)]
    spans.sort(key=lambda span: span[0], reverse=True)
    prediction = Prediction(text=context[spans[0][1]:spans[0][2]] if spans else "")
    ranked = [(score, context[start:end], s_logit, e_logit) for score, start, end, s_logit, e_logit in spans]
    if with_null:
        null = min((logits.null_start + logits.null_end, "", logits.null_start, logits.null_end)
                   for logits, _ in windows)
        # float32, as the logits and the logged metrics: a tau read back from results.json splits the odds
        # alike
        prediction.null_odds = float(np.float32(null[0] - spans[0][0])) if spans else math.inf
        ranked = sorted([*ranked, null], key=lambda entry: entry[0], reverse=True)
    entries, seen = [], set()
    for entry in ranked:
        if entry[1] not in seen and len(entries) < n_best_size:
            seen.add(entry[1])
            entries.append(entry)
    if with_null and "" not in seen:
        entries.append(null)  # run_squad.py lists the null answer even below the n-best
    if not entries:
        entries = [(0.0, "", 0.0, 0.0)]
    scores = np.array([entry[0] for entry in entries])
    probabilities = np.exp(scores - scores.max())
    probabilities /= probabilities.sum()
    prediction.nbest = [{"text": text, "probability": float(p), "start_logit": s, "end_logit": e}
                        for (_, text, s, e), p in zip(entries, probabilities)]
    return prediction


def apply_threshold(predictions: dict[str, Prediction], tau: float) -> dict[str, str]:
    """v2 §4.3: the best span where s_best > s_null + tau (null odds <= tau), else no answer ("")."""
    return {q: p.text if p.null_odds is None or p.null_odds <= tau else "" for q, p in predictions.items()}


def score(answers: dict[str, list[str]], predictions: dict[str, Prediction],
          version: int) -> tuple[dict, dict, float | None]:
    """Metrics (val/ names without the prefix), the final answers and, for v2.0, the tuned threshold tau."""
    if version == 1:
        final = {q: p.text for q, p in predictions.items()}
        return evaluate_v1(answers, final), final, None
    odds = {q: p.null_odds for q, p in predictions.items()}
    tuned = evaluate_v2(answers, {q: p.text for q, p in predictions.items()}, odds)
    tau = tuned["best_f1_thresh"]
    if tuned["best_f1"] <= 100.0 * sum(not texts for texts in answers.values()) / len(answers):
        # no answer beats "no answer" anywhere: evaluate-v2.0.py reports 0.0, but the tau that predicts
        # null for every question is the one just below the lowest null odds
        tau = float(np.nextafter(np.float32(min(odds.values())), np.float32(-np.inf)))
    final = apply_threshold(predictions, tau)
    at_tau = evaluate_v2(answers, final)
    metrics = {"exact_match": at_tau["exact"], "f1": at_tau["f1"],
               **{f"{split}_{m}": at_tau[f"{prefix}_{m}"] for split, prefix in (("has_ans", "HasAns"),
                                                                                ("no_ans", "NoAns"))
                  for m in ("exact", "f1") if f"{prefix}_{m}" in at_tau},
               **{k: tuned[k] for k in ("best_exact", "best_exact_thresh", "best_f1", "best_f1_thresh")},
               "null_threshold": tau}
    return metrics, final, tau


def write_prediction_files(out_dir: str | Path, final: dict[str, str],
                           predictions: dict[str, Prediction]) -> list[Path]:
    """predictions.json, nbest_predictions.json and (v2.0) null_odds.json, as the released run_squad.py."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {"predictions.json": final,
             "nbest_predictions.json": {q: p.nbest for q, p in predictions.items()}}
    if any(p.null_odds is not None for p in predictions.values()):
        files["null_odds.json"] = {q: p.null_odds for q, p in predictions.items()}
    written = []
    for name, content in files.items():
        path = out_dir / name
        path.write_text(json.dumps(content, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        written.append(path)
    return written
