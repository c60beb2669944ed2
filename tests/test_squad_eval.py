"""SQuAD scoring and post-processing against hand-computed cases (official evaluate-v1.1 / v2.0 semantics,
released run_squad.py's n-best and null answer)."""

import json

import numpy as np
import pytest

from bert_repro.data.squad import max_context, window_starts
from bert_repro.metrics.squad import evaluate_v1, evaluate_v2, exact_score, f1_score, normalize_answer
from bert_repro.squad_eval import Window, WindowLogits, predict_question, score, write_prediction_files


def test_normalisation_and_token_f1_by_hand():
    assert normalize_answer("  The Denver  Broncos!") == "denver broncos"
    assert normalize_answer("an apple, a day") == "apple day"
    assert normalize_answer("Levi's") == "levis"
    assert normalize_answer("theatre") == "theatre"  # articles only as whole words
    assert exact_score("The Denver Broncos", "denver broncos.") == 1
    # gold [santa, clara, california], pred [levis, stadium, in, santa, clara]: P = 2/5, R = 2/3 -> F1 = 0.5
    assert f1_score("Santa Clara, California", "Levi's Stadium in Santa Clara") == pytest.approx(0.5)
    assert f1_score("the cat sat on the mat", "cat on mat") == pytest.approx(2 * 1 * 0.75 / 1.75)
    assert f1_score("", "") == 1.0 and f1_score("", "a") == 1.0  # "a" normalises to nothing: a no-answer
    assert f1_score("", "1990") == 0.0 and f1_score("1990", "") == 0.0


def test_v1_scores_take_the_best_gold_answer():
    answers = {"a": ["Denver Broncos", "The Denver Broncos"], "b": ["Santa Clara, California", "Santa Clara"]}
    preds = {"a": "Broncos", "b": "Levi's Stadium in Santa Clara"}
    # a: P = 1, R = 1/2 -> 2/3; b: against "Santa Clara" P = 2/5, R = 1 -> 4/7 (against the first, 1/2)
    got = evaluate_v1(answers, preds)
    assert got["exact_match"] == pytest.approx(0.0)
    assert got["f1"] == pytest.approx(100 * (2 / 3 + 4 / 7) / 2, abs=1e-4)
    assert evaluate_v1(answers, {"a": "the denver broncos", "b": "Santa Clara"}) == pytest.approx(
        {"exact_match": 100.0, "f1": 100.0})
    for qid in answers:  # torchmetrics' SQuAD and our v2.0 comparison agree wherever a gold answer exists
        one = evaluate_v1({qid: answers[qid]}, {qid: preds[qid]})
        assert one["f1"] == pytest.approx(100 * max(f1_score(g, preds[qid]) for g in answers[qid]), abs=1e-4)


ANSWERS = {"a": ["Denver Broncos", "The Denver Broncos"], "b": ["Santa Clara, California"], "c": [], "d": []}


def test_v2_has_and_no_answer_splits_by_hand():
    preds = {"a": "denver broncos", "b": "Levi's Stadium in Santa Clara", "c": "", "d": "1990"}
    got = evaluate_v2(ANSWERS, preds)  # exact a 1, b 0, c 1, d 0; f1 a 1, b 0.5, c 1, d 0
    assert got == pytest.approx({"exact": 50.0, "f1": 62.5, "total": 4, "HasAns_exact": 50.0,
                                 "HasAns_f1": 75.0, "HasAns_total": 2, "NoAns_exact": 50.0, "NoAns_f1": 50.0,
                                 "NoAns_total": 2})
    only_answerable = evaluate_v2({"a": ANSWERS["a"]}, preds)
    assert "NoAns_f1" not in only_answerable and only_answerable["HasAns_f1"] == 100.0


def test_v2_threshold_search_by_hand():
    """Every question answered; null odds decide. From all-null (2 of 4 right) answer in increasing odds:
    a (-5) +1 -> 3, b (-2) +0.5 -> 3.5, d (-1) -1 -> 2.5, c (2) -1 -> 1.5: best F1 3.5/4 at -2;
    exact: a +1 -> 3 at -5, b +0, d -1, c -1: best 3/4 at -5."""
    preds = {"a": "denver broncos", "b": "Levi's Stadium in Santa Clara", "c": "Stanford", "d": "1990"}
    odds = {"a": -5.0, "b": -2.0, "c": 2.0, "d": -1.0}
    got = evaluate_v2(ANSWERS, preds, odds)
    assert (got["best_f1"], got["best_f1_thresh"]) == pytest.approx((87.5, -2.0))
    assert (got["best_exact"], got["best_exact_thresh"]) == pytest.approx((75.0, -5.0))
    # evaluate-v2.0.py's --na-prob-thresh (1.0) applies to exact / f1: c's odds 2 > 1 count as a null answer
    assert (got["exact"], got["f1"]) == pytest.approx((50.0, 62.5))
    assert got["NoAns_exact"] == 50.0  # c right by the threshold, d wrong


class _Prediction:
    def __init__(self, text, null_odds):
        self.text, self.null_odds = text, null_odds


def test_v2_answers_use_the_tuned_threshold():
    predictions = {"a": _Prediction("denver broncos", -5.0),
                   "b": _Prediction("Levi's Stadium in Santa Clara", -2.0), "c": _Prediction("Stanford", 2.0),
                   "d": _Prediction("1990", -1.0)}
    metrics, final, tau = score(ANSWERS, predictions, version=2)
    assert tau == -2.0 and final == {"a": "denver broncos", "b": "Levi's Stadium in Santa Clara", "c": "",
                                     "d": ""}
    assert metrics["f1"] == pytest.approx(metrics["best_f1"]) == pytest.approx(87.5)
    assert metrics["exact_match"] == pytest.approx(75.0) and metrics["null_threshold"] == -2.0
    assert (metrics["has_ans_f1"], metrics["no_ans_f1"]) == pytest.approx((75.0, 100.0))


def test_v2_all_null_is_best_when_no_answer_helps():
    """evaluate-v2.0.py reports threshold 0.0 when nothing beats all-null; the tau used must give all-null."""
    answers = {"x": [], "y": ["Paris"]}
    predictions = {"x": _Prediction("Lyon", -1.0), "y": _Prediction("Berlin", -3.0)}
    metrics, final, tau = score(answers, predictions, version=2)
    assert metrics["best_f1_thresh"] == 0.0 and metrics["best_f1"] == 50.0
    assert tau < -3.0 and final == {"x": "", "y": ""} and metrics["f1"] == 50.0


# A passage of 14 tokens in two windows (3 question positions before it): window 0 holds tokens 0-9,
# window 1 tokens 5-13; tokens 0-7 have their maximum context in window 0, 8-13 in window 1.
CONTEXT = "Super Bowl 50 was played at Levi's Stadium in Santa Clara."
OFFSETS = [(0, 5), (6, 10), (11, 13), (14, 17), (18, 24), (25, 27), (28, 32), (32, 33), (33, 34), (35, 42),
           (43, 45), (46, 51), (52, 57), (57, 58)]


def windows(null=((0.5, 0.5), (2.0, 1.5))):
    starts = window_starts(14, 10, 5)
    best = max_context(starts, 14, 10)
    assert starts == [0, 5] and best[0].tolist() == [True] * 8 + [False] * 6
    spans = [Window(3, OFFSETS[s:s + 10], best[w, s:s + 10].tolist()) for w, s in enumerate(starts)]
    arr = np.array
    # window 0: start at position 9 (Levi), 1 (a question token, highest logit), 12 (Stadium: max context in
    # window 1); end at 12 (Stadium), 9 (Levi), 5 (before any start)
    w0 = WindowLogits(arr([9, 1, 12]), arr([3.0, 10.0, 1.0]), arr([12, 9, 5]), arr([2.0, 1.0, 9.0]), *null[0])
    # window 1: start at 9 (Santa), 4 (Levi: max context in window 0); end at 10 (Clara), 11 (.), 2 (question)
    w1 = WindowLogits(arr([9, 4]), arr([4.0, 6.0]), arr([10, 11, 2]), arr([3.0, 0.5, 8.0]), *null[1])
    return [(w0, spans[0]), (w1, spans[1])]


def test_best_span_across_windows_by_hand():
    """Valid: Santa-Clara 7.0, Levi-Stadium 5.0, Santa-'.' 4.5, Levi-Levi 4.0; everything else is refused."""
    p = predict_question(CONTEXT, windows(), n_best_size=20, max_answer_length=30, with_null=False)
    assert p.text == "Santa Clara" and p.null_odds is None
    assert [e["text"] for e in p.nbest] == ["Santa Clara", "Levi's Stadium", "Santa Clara.", "Levi"]
    assert [e["start_logit"] + e["end_logit"] for e in p.nbest] == [7.0, 5.0, 4.5, 4.0]
    expected = np.exp([7.0, 5.0, 4.5, 4.0]) / np.exp([7.0, 5.0, 4.5, 4.0]).sum()
    assert [e["probability"] for e in p.nbest] == pytest.approx(expected.tolist())
    short = predict_question(CONTEXT, windows(), n_best_size=2, max_answer_length=1, with_null=False)
    assert [e["text"] for e in short.nbest] == ["Levi"]  # single tokens only
    two = predict_question(CONTEXT, windows(), n_best_size=2, max_answer_length=30, with_null=False)
    assert [e["text"] for e in two.nbest] == ["Santa Clara", "Levi's Stadium"]


def test_null_answer_by_hand():
    """s_null = the lowest S.C + E.C over the windows (0.5 + 0.5 = 1.0); null odds = 1.0 - 7.0."""
    p = predict_question(CONTEXT, windows(), n_best_size=2, max_answer_length=30, with_null=True)
    assert p.text == "Santa Clara" and p.null_odds == pytest.approx(-6.0)
    # null listed below the n-best
    assert [e["text"] for e in p.nbest] == ["Santa Clara", "Levi's Stadium", ""]
    strong_null = predict_question(CONTEXT, windows(((9.0, 1.0), (6.0, 6.0))), 2, 30, with_null=True)
    assert strong_null.null_odds == pytest.approx(3.0) and strong_null.nbest[0]["text"] == ""
    assert [e["text"] for e in strong_null.nbest] == ["", "Santa Clara"] and strong_null.text == "Santa Clara"


def test_prediction_files(tmp_path):
    predictions = {"q1": predict_question(CONTEXT, windows(), 20, 30, with_null=True)}
    _, final, _ = score({"q1": ["Santa Clara"]}, predictions, version=2)
    names = [p.name for p in write_prediction_files(tmp_path, final, predictions)]
    assert names == ["predictions.json", "nbest_predictions.json", "null_odds.json"]
    assert json.loads((tmp_path / "predictions.json").read_text()) == {"q1": "Santa Clara"}
    assert json.loads((tmp_path / "null_odds.json").read_text()) == {"q1": pytest.approx(-6.0)}
    nbest = json.loads((tmp_path / "nbest_predictions.json").read_text())["q1"]
    assert set(nbest[0]) == {"text", "probability", "start_logit", "end_logit"}
    assert sum(e["probability"] for e in nbest) == pytest.approx(1.0)
