"""SQuAD post-processing (§4.2; v2 §4.3) with the semantics of the released run_squad.py; the scoring is
bert_repro.metrics.squad's.

In each window the ``n_best_size`` highest start and end logits give candidate spans (passage tokens only,
end >= start, at most ``max_answer_length`` tokens, starting where the token has its maximum context); a span
scores S.T_i + E.T_j and its text is cut out of the original context through the tokens' character offsets.
Across a question's windows the best span wins. v2.0 adds the null answer, s_null = S.C + E.C (the lowest
over the windows, as run_squad.py), and its null odds s_null - s_best, which the scoring thresholds.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bert_repro.metrics.squad import evaluate_v1, score_v2


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


def score(answers: dict[str, list[str]], predictions: dict[str, Prediction],
          version: int) -> tuple[dict, dict, float | None]:
    """Metrics (val/ names without the prefix), the final answers and, for v2.0, the tuned threshold tau."""
    texts = {q: p.text for q, p in predictions.items()}
    if version == 1:
        return evaluate_v1(answers, texts), texts, None
    metrics, final = score_v2(answers, texts, {q: p.null_odds for q, p in predictions.items()})
    return metrics, final, metrics["null_threshold"]


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
