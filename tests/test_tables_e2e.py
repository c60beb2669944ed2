"""One table end to end on a CPU: `python -m bert_repro.tables run table5` (what `make table5` runs), cut to one
row and two columns with tiny settings. Real Hydra multiruns: a 2-step pre-training run, an MRPC sweep from its
checkpoint, and a column whose task does not exist (a compose error) marked failed with Hydra's reason.
Then a second run of the table launches nothing: every run is complete."""

import csv
import json
import os
import subprocess
import sys

import pytest

from .conftest import REPO

SHRINK = [  # --set on the table config: one row, MRPC plus a column that cannot compose, tiny steps
    "rows.no_nsp=null", "rows.ltr_no_nsp=null", "rows.ltr_no_nsp_bilstm=null",
    "pretrain.no_nsp=null", "pretrain.ltr_no_nsp=null",
    "columns.mnli_m_acc=null", "columns.sst2_acc=null", "columns.squad_v1_f1=null",
    "columns.qnli_acc.task=no_such_task",
    "pretrain_overrides.optim.max_steps=2", "pretrain_overrides.optim.val_check_interval=2",
    "pretrain_overrides.optim.limit_val_batches=1", "pretrain_overrides.scale.pretrain.vocab_size=1000",
    "pretrain_overrides.scale.pretrain.max_documents=30", "pretrain_overrides.data.batch_size=8",
    "task_data.mrpc.data.max_train_examples=32", "grid.optim.lr=1e-3,1e-4",
]


def tables(tmp_path, *args):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "BERT_REPRO_CACHE": str(tmp_path / "cache")}
    flags = [f"--set={s}" for s in SHRINK] + ["--runs-dir", str(tmp_path / "runs"), "--results-dir", str(tmp_path / "results")]
    return subprocess.run([sys.executable, "-m", "bert_repro.tables", *args, *flags], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_table5_in_miniature_runs_collects_and_resumes(tmp_path, shared_data):
    proc = tables(tmp_path, "run", "table5", "--scale", "smoke")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    root = tmp_path / "runs" / "table5" / "smoke"
    mrpc_jobs = sorted(p.name for p in (root / "finetune" / "bert_base" / "mrpc").iterdir() if p.is_dir())
    assert mrpc_jobs == ["optim.lr=0.0001", "optim.lr=0.001"]  # Hydra named them as the table expected
    pretrain = json.loads((root / "pretrain" / "none" / "default" / "results.json").read_text())
    assert pretrain["status"] == "complete" and pretrain["global_step"] == 2
    init = json.loads((root / "finetune" / "bert_base" / "mrpc" / "optim.lr=0.001" / "results.json").read_text())["init"]
    assert init == str(root / "pretrain" / "none" / "default" / "checkpoints" / "last.ckpt")

    md = (tmp_path / "results" / "table5.md").read_text()
    assert "scale=smoke" in md and "Checkpoint, BERT-base (MLM + NSP): our pre-training run pretrain/none (tiny)" in md
    with (tmp_path / "results" / "table5.csv").open() as f:
        cells = {r["column"]: r for r in csv.DictReader(f)}
    assert sorted(cells) == ["mrpc_acc", "qnli_acc"]
    mrpc = cells["mrpc_acc"]
    runs = [json.loads((root / "finetune" / "bert_base" / "mrpc" / job / "results.json").read_text()) for job in mrpc_jobs]
    best = max(100 * r["metrics"]["final"]["val/acc"] for r in runs if not r["degenerate"]) if any(
        not r["degenerate"] for r in runs) else max(100 * r["metrics"]["final"]["val/acc"] for r in runs)
    assert mrpc["status"] == "ok" and float(mrpc["ours"]) == pytest.approx(best) and float(mrpc["paper"]) == 86.7
    assert float(mrpc["diff"]) == pytest.approx(best - 86.7)
    qnli = cells["qnli_acc"]
    assert qnli["status"] == "failed" and qnli["ours"] == "" and "no_such_task" in qnli["reason"]
    assert (tmp_path / "results" / "table5.tex").is_file()

    again = tables(tmp_path, "run", "table5", "--scale", "smoke")
    assert again.returncode == 0, again.stderr[-3000:]
    summary = json.loads((root / "summary.json").read_text())["sweeps"]
    counts = {s["sweep"]: (s["skipped"], s["complete"]) for s in summary}
    assert counts["pretrain/none"] == (1, 0) and counts["finetune/bert_base/mrpc"] == (2, 0)
    assert (tmp_path / "results" / "table5.md").read_text() == md
