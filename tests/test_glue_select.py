"""The selection tool on hand-made sweep folders: best on Dev per setting, degenerate runs flagged and
passed over, mean +- std over restarts, the Table 1 average, unusable runs reported."""

import json
import statistics

import pytest

from bert_repro import selection


def write_run(root, name, task, seed, lr, final, model="base", monitor=None, mode="max", status="complete",
              majority=False, warmup=0.1):
    monitor = monitor or {"mnli": "val/mnli_m_acc", "stsb": "val/spearman", "cola": "val/mcc",
                          "mrpc": "val/f1", "qqp": "val/f1"}.get(task, "val/acc")
    folder = root / name
    folder.mkdir(parents=True)
    results = {"status": status, "task": task, "model": model, "ablation": "none", "scale": "smoke",
               "init": "/ckpt",
               "seed": seed, "monitor": monitor, "predict_majority": majority, "metrics": {"final": final},
               "config": {"seed": seed, "task": {"monitor_mode": mode},
                          "optim": {"lr": lr, "epochs": 3, "warmup_ratio": warmup},
                          "data": {"batch_size": 32, "max_train_examples": None, "seed": seed},
                          "paths": {"output_dir": str(root / name)}}}
    (folder / "results.json").write_text(json.dumps(results))
    return folder


def test_best_on_dev_skips_collapsed_runs(tmp_path):
    write_run(tmp_path, "a", "rte", 1, 5e-5, {"val/acc": 0.66, "val/top_class_share": 0.6})
    write_run(tmp_path, "b", "rte", 1, 3e-5, {"val/acc": 0.70, "val/top_class_share": 0.55})
    collapsed = write_run(tmp_path, "c", "rte", 1, 2e-5, {"val/acc": 0.72, "val/top_class_share": 1.0})
    write_run(tmp_path, "d", "rte", 1, 4e-5, {"val/acc": None}, status="failed")
    runs, skipped = selection.load_runs([tmp_path])
    (entry,) = selection.select(runs)
    assert entry["selected"].endswith("/b") and entry["hparams"]["lr"] == 3e-5 and entry["runs"] == 3
    assert entry["degenerate"][0]["dir"] == str(collapsed) and len(skipped) == 1 and "failed" in skipped[0]
    # with a stricter collapse threshold the 0.72 run is healthy and wins
    runs, _ = selection.load_runs([tmp_path], collapse_share=1.01)
    assert selection.select(runs)[0]["selected"].endswith("/c")


def test_restarts_report_mean_and_std_per_hyper_parameters(tmp_path):
    scores = {5e-5: [0.80, 0.84, 0.82], 2e-5: [0.86, 0.70, 0.78]}
    for lr, values in scores.items():
        for seed, value in enumerate(values):
            write_run(tmp_path, f"lr{lr}_s{seed}", "sst2", seed, lr, {"val/acc": value})
    (entry,) = selection.select(selection.load_runs([tmp_path])[0], restarts=True)
    assert entry["hparams"]["lr"] == 5e-5 and entry["seeds"] == [0, 1, 2]
    assert entry["restarts"]["val/acc"]["mean"] == pytest.approx(0.82)
    assert entry["restarts"]["val/acc"]["std"] == pytest.approx(statistics.stdev(scores[5e-5]))
    # a run that differs in anything but the seed (here the warm-up) is not pooled with them
    write_run(tmp_path, "other_warmup", "sst2", 3, 5e-5, {"val/acc": 0.95}, warmup=0.0)
    (entry,) = selection.select(selection.load_runs([tmp_path])[0], restarts=True)
    assert entry["seeds"] == [3] and entry["restarts"]["val/acc"]["n"] == 1
    loss_runs = tmp_path / "loss"
    write_run(loss_runs, "x", "stsb", 1, 1e-5, {"val/loss": 0.9, "val/spearman": 0.5}, monitor="val/loss",
              mode="min")
    write_run(loss_runs, "y", "stsb", 1, 2e-5, {"val/loss": 0.7, "val/spearman": 0.4}, monitor="val/loss",
              mode="min")
    assert selection.select(selection.load_runs([loss_runs])[0])[0]["selected"].endswith("/y")


def test_mrpc_is_selected_on_the_metric_its_table_reports(tmp_path, capsys):
    """Table 1 reports MRPC F1, Tables 5 and 6 accuracy (PAPER.md; reference.yaml): the run chosen is the one
    best on that number, not on the task's monitor (F1) whatever the table shows."""
    write_run(tmp_path, "lr5", "mrpc", 1, 5e-5, {"val/f1": 0.90, "val/acc": 0.84})
    write_run(tmp_path, "lr2", "mrpc", 1, 2e-5, {"val/f1": 0.88, "val/acc": 0.86})
    write_run(tmp_path, "lr3", "mrpc", 1, 3e-5, {"val/f1": 0.89})  # no accuracy: never chosen on it
    runs = selection.load_runs([tmp_path])[0]
    (on_f1,) = selection.select(runs, metric="val/f1")
    (on_acc,) = selection.select(runs, metric="val/acc")
    assert selection.select(runs)[0]["selected"] == on_f1["selected"] == str(tmp_path / "lr5")
    assert on_acc["selected"] == str(tmp_path / "lr2") and on_acc["metrics"]["val/acc"] == 0.86
    assert on_acc["monitor"] == "val/acc"
    (restarts,) = selection.select(runs, restarts=True, metric="val/acc")
    assert restarts["hparams"]["lr"] == 2e-5
    assert selection.main([str(tmp_path), "--metric", "val/acc", "--out", str(tmp_path / "sel")]) == 0
    assert "| mrpc | base | none | val/acc | 0.8600 | 2e-05 |" in capsys.readouterr().out


def test_table1_average_and_summary(tmp_path, capsys):
    table1 = {"mnli": {"val/mnli_m_acc": 0.846, "val/mnli_mm_acc": 0.834}, "qqp": {"val/f1": 0.712},
              "qnli": {"val/acc": 0.905}, "sst2": {"val/acc": 0.935}, "cola": {"val/mcc": 0.521},
              "stsb": {"val/spearman": 0.858, "val/pearson": 0.87}, "mrpc": {"val/f1": 0.889},
              "rte": {"val/acc": 0.664}}
    for task, final in table1.items():
        write_run(tmp_path, task, task, 1, 2e-5, final)
    write_run(tmp_path, "wnli", "wnli", 1, 2e-5, {"val/acc": 0.563, "val/top_class_share": 1.0},
              majority=True)
    other = write_run(tmp_path, "rte_large", "rte", 1, 2e-5, {"val/acc": 0.70}, model="large")
    assert selection.main([str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "selection.json").read_text())
    (base,) = [row for row in summary["glue"] if row["model"]["model"] == "base"]
    assert round(base["average"], 1) == 79.6 and base["scores"]["mnli_mm"] == pytest.approx(83.4)
    (large,) = [row for row in summary["glue"] if row["model"]["model"] == "large"]
    assert large["average"] is None  # one task of nine
    # WNLI's majority class is the method, not a collapse
    assert all(not e["degenerate"] for e in summary["selection"])
    text = (tmp_path / "selection.md").read_text()
    assert "GLUE average" in text and "79.6" in text and str(other) in text and capsys.readouterr().out == (
        text + f"wrote {tmp_path / 'selection.json'} and {tmp_path / 'selection.md'}\n")
    # one model per submission: two settings for RTE cannot both go to the server
    assert selection.main([str(tmp_path), "--submit"]) == 2
    assert "several settings" in capsys.readouterr().err


def test_unusable_input_is_reported(tmp_path, capsys):
    assert selection.main([str(tmp_path / "missing")]) == 2
    assert "is not a folder of runs" in capsys.readouterr().err
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "results.json").write_text("{not json")
    # a damaged results.json is an error naming it, not skipped silently
    assert selection.main([str(tmp_path)]) == 2
    assert "broken/results.json is not a results.json as src/train.py writes it" in capsys.readouterr().err


def test_submit_over_a_truncated_checkpoint_names_it(tmp_path, capsys):
    from bert_repro.lifecycle.folder import RunFolder

    run = RunFolder(write_run(tmp_path, "a", "rte", 1, 2e-5, {"val/acc": 0.66, "val/top_class_share": 0.6}))
    run.checkpoints.mkdir()
    run.last.write_bytes(b"PK\x03\x04" + b"\x00" * 100)  # a zip header, cut short: a torch.save cut off
    assert selection.main([str(tmp_path), "--submit", "--out", str(tmp_path / "sub")]) == 2
    said = capsys.readouterr()
    assert f"error: {run.last}: not a readable bert_repro Lightning checkpoint" in said.err
    assert "Traceback" not in said.out + said.err
