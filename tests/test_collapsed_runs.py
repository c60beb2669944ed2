"""A fine-tune that collapsed onto one class (scores.degenerate_reason) says so where its number is read:
under the run's printed results, in the run's log, and in the table cell itself, not only in results.json."""

import json
import logging

import pytest
from rich.console import Console

from bert_repro.lifecycle.results import print_results
from bert_repro.scores import degenerate_reason
from bert_repro.tables import runner
from bert_repro.tables.collect import collect, load_reference
from bert_repro.tables.render import latex, markdown, page
from bert_repro.tables.spec import build

COLLAPSED = {"val/acc": 0.684, "val/f1": 0.812, "val/top_class_share": 1.0}  # MRPC's majority class


def results(final: dict) -> dict:
    return {"task": "mrpc", "model": "base", "ablation": "none", "seed": 1, "scale": "budget",
            "model_config": {"vocab_size": 30522}, "metrics": {"final": final}, "global_step": 345,
            "wall_time_s": 61.0, "degenerate": degenerate_reason(final)}


def test_a_collapsed_run_prints_and_logs_a_warning_under_its_table(caplog):
    console = Console(record=True, width=200)
    with caplog.at_level(logging.WARNING, logger="bert_repro.lifecycle.results"):
        print_results(results(COLLAPSED), console)
    screen = console.export_text()
    below = screen[screen.index("wall time (s)"):]
    assert "WARNING mrpc: collapsed (val/top_class_share=1.000" in below
    (record,) = caplog.records
    assert record.levelno == logging.WARNING and "collapsed" in record.message

    console = Console(record=True, width=200)
    caplog.clear()
    print_results(results({"val/acc": 0.84, "val/f1": 0.88, "val/top_class_share": 0.66}), console)
    assert "WARNING" not in console.export_text() and not caplog.records


@pytest.mark.slow
def test_a_table_cell_whose_selected_run_collapsed_is_marked_in_the_cell(tmp_path):
    table = build("table5", "smoke", tmp_path / "runs", sets=["grid.optim.lr=1e-3"])
    sweep = table.sweeps["finetune/bert_base/mrpc"]
    ((_, folder),) = sweep.jobs()
    folder.mkdir(parents=True)
    (folder / "results.json").write_text(json.dumps({
        "status": "complete", "task": "mrpc", "model": "tiny", "ablation": "none", "scale": "smoke",
        "seed": 1, "init": None, "monitor": "val/acc", "predict_majority": False,
        "metrics": {"final": COLLAPSED},
        "config": runner.job_configs(table)[folder]}))  # its science as composed: collect holds it to that
    cell = collect(table, load_reference())["main"][0].cells["mrpc_acc"]
    assert cell.value == pytest.approx(68.4) and "top_class_share" in cell.degenerate
    blocks = page(table, collect(table, load_reference()), {})
    line = next(row for row in markdown(blocks).splitlines() if row.startswith("| BERT"))
    assert "68.4 (86.7; -18.3) **collapsed** [" in line  # the mark, then the note with the reason
    tex = latex(blocks)
    assert r"\textbf{collapsed}" in tex and "**" not in tex  # LaTeX's bold, not Markdown's


def test_selection_marks_a_collapsed_choice_breaks_ties_by_dev_loss_and_submit_refuses_it(tmp_path, capsys):
    from bert_repro import selection

    from .test_glue_select import write_run

    # every run collapsed onto MRPC's majority class: the same F1; the lowest Dev loss is chosen, not "a"
    for name, loss in (("a", 0.69), ("b", 0.61), ("c", 0.64)):
        write_run(tmp_path, name, "mrpc", 1, {"a": 5e-5, "b": 3e-5, "c": 2e-5}[name],
                  {**COLLAPSED, "val/loss": loss})
    runs, _ = selection.load_runs([tmp_path])
    (entry,) = selection.select(runs)
    assert entry["selected"].endswith("/b") and "top_class_share" in entry["collapsed"]
    (entry,) = selection.select(runs, restarts=True)
    assert entry["selected"].endswith("/b") and entry["collapsed"]
    assert selection.main([str(tmp_path), "--out", str(tmp_path / "sel")]) == 0
    row = next(line for line in (tmp_path / "sel" / "selection.md").read_text().splitlines()
               if line.startswith("| mrpc"))
    assert "0.8120 **collapsed** (val/top_class_share=1.000" in row
    capsys.readouterr()
    # --submit refuses the collapsed choice by name, before predicting anything
    assert selection.main([str(tmp_path), "--submit", "--out", str(tmp_path / "sub")]) == 2
    said = capsys.readouterr().err
    assert f"{tmp_path / 'b'} (val/top_class_share=1.000" in said and "--allow-collapsed" in said
    assert not (tmp_path / "sub" / "submission.zip").exists()
    # a healthy run wins over any collapsed one, whatever its loss
    write_run(tmp_path, "d", "mrpc", 1, 1e-5, {"val/f1": 0.70, "val/top_class_share": 0.6, "val/loss": 0.9})
    (entry,) = selection.select(selection.load_runs([tmp_path])[0])
    assert entry["selected"].endswith("/d") and entry["collapsed"] is None
