"""One table end to end on a CPU: `python -m bert_repro.tables run table5` (what `make table5` runs), cut to
one row and one column with tiny settings. Real Hydra multiruns: a 2-step pre-training run and an MRPC sweep
from its checkpoint. A second run of the table launches nothing: every run is complete;
notebooks/tables.ipynb executes top to bottom on those results (one table run, shared by the tests); and,
last, a relaunch with another number of epochs reruns the MRPC jobs alone and rebuilds the table from them."""

import csv
import json
import logging
import shlex
import shutil

import pytest
import torch

from .conftest import REPO, run_py, shared_data_dir

SHRINK = [  # --set on the table config: one row, MRPC plus a column that cannot compose, tiny steps
    "rows.no_nsp=null", "rows.ltr_no_nsp=null", "rows.ltr_no_nsp_bilstm=null",
    "pretrain.no_nsp=null", "pretrain.ltr_no_nsp=null",
    "columns.mnli_m_acc=null", "columns.sst2_acc=null", "columns.squad_v1_f1=null",
    "columns.qnli_acc=null",
    "pretrain_overrides.optim.max_steps=2", "pretrain_overrides.optim.val_check_interval=2",
    "pretrain_overrides.optim.limit_val_batches=1", "pretrain_overrides.scale.pretrain.vocab_size=1000",
    "pretrain_overrides.scale.pretrain.max_documents=30", "pretrain_overrides.data.batch_size=8",
    "task_data.mrpc.data.max_train_examples=32", "grid.optim.lr=1e-3,1e-4",
]


def tables(tmp_path, *args):
    """`python -m bert_repro.tables ARGS` with the tiny settings, in this process (conftest.in_process): its
    runs are forked from this worker's forkserver (tables/warm.py), started once for all of them."""
    flags = [f"--set={s}" for s in SHRINK] + ["--runs-dir", str(tmp_path / "runs"),
                                               "--results-dir", str(tmp_path / "results")]
    with pytest.MonkeyPatch.context() as env:
        env.setenv("BERT_REPRO_CACHE", str(tmp_path / "cache"))
        # a new interpreter's root logger, which the CLI's logging.basicConfig gives its stderr handler
        env.setattr(logging.getLogger(), "handlers", [])
        return run_py(*args, *flags, module="bert_repro.tables")


@pytest.fixture(scope="module")
def table5_run(tmp_path_factory):
    """The miniature table run once for this module; its folder holds runs/ and results/."""
    if shared_data_dir() is None:
        pytest.skip("../shared/data (the project's real-data fixtures) is absent on this clone; "
                    "set BERT_REPRO_SHARED_DATA to its location to run this test")
    tmp_path = tmp_path_factory.mktemp("table5")
    proc = tables(tmp_path, "run", "table5", "--scale", "smoke")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return tmp_path


def csv_cells(tmp_path) -> dict[str, dict]:
    with (tmp_path / "results" / "table5.csv").open() as f:
        return {r["column"]: r for r in csv.DictReader(f)}


@pytest.mark.slow
def test_table5_in_miniature_runs_collects_and_resumes(table5_run):
    tmp_path = table5_run
    root = tmp_path / "runs" / "table5" / "smoke"
    mrpc_jobs = sorted(p.name for p in (root / "finetune" / "bert_base" / "mrpc").iterdir() if p.is_dir())
    assert mrpc_jobs == ["optim.lr-0.0001", "optim.lr-0.001"]  # Hydra named them as the table did (run_name)
    stored = list((tmp_path / "runs" / "pretrain" / "smoke").iterdir())  # the shared pre-training store
    assert len(stored) == 1 and stored[0].name.startswith("L2_H128_A2-"), stored
    pretrain = json.loads((stored[0] / "default" / "results.json").read_text())
    assert pretrain["status"] == "complete" and pretrain["global_step"] == 2
    mrpc_dir = root / "finetune" / "bert_base" / "mrpc"
    init = json.loads((mrpc_dir / "optim.lr-0.001" / "results.json").read_text())["init"]
    assert init == str(stored[0] / "default" / "checkpoints" / "last.ckpt")

    md = (tmp_path / "results" / "table5.md").read_text()
    assert "scale=smoke" in md
    assert "Checkpoint, BERT-base (MLM + NSP): our pre-training run pretrain/none (tiny)" in md
    cells = csv_cells(tmp_path)
    assert sorted(cells) == ["mrpc_acc"]
    mrpc = cells["mrpc_acc"]
    runs = [json.loads((mrpc_dir / job / "results.json").read_text()) for job in mrpc_jobs]
    best = max(100 * r["metrics"]["final"]["val/acc"] for r in runs if not r["degenerate"]) if any(
        not r["degenerate"] for r in runs) else max(100 * r["metrics"]["final"]["val/acc"] for r in runs)
    assert mrpc["status"] == "ok" and float(mrpc["ours"]) == pytest.approx(best)
    assert float(mrpc["paper"]) == 86.7
    assert float(mrpc["diff"]) == pytest.approx(best - 86.7)
    assert (tmp_path / "results" / "table5.tex").is_file()
    saved = json.loads((tmp_path / "results" / "table5.json").read_text())
    # one seed per grid point
    assert saved["parts"]["main"]["rows"][0]["cells"]["mrpc_acc"]["restarts"]["n"] == 1
    # every row they compare was removed above: each listed as skipped, saying so
    assert {c["verdict"] for c in saved["comparisons"]} == {"skipped"}

    again = tables(tmp_path, "run", "table5", "--scale", "smoke")
    assert again.returncode == 0, again.stderr[-3000:]
    summary = json.loads((root / "summary.json").read_text())["sweeps"]
    counts = {s["sweep"]: (s["skipped"], s["complete"]) for s in summary}
    assert counts["pretrain/none"] == (1, 0) and counts["finetune/bert_base/mrpc"] == (2, 0)
    assert (tmp_path / "results" / "table5.md").read_text() == md


def outputs_text(cell) -> str:
    return "\n".join(o.get("text", "") + o.get("data", {}).get("text/plain", "") for o in cell.outputs)


@pytest.mark.slow
def test_tables_notebook_runs_top_to_bottom_on_the_smoke_results(table5_run, monkeypatch):
    pytest.importorskip("ipykernel", reason="the notebook test needs ipykernel (pip install -e '.[dev]')")
    nbclient, nbformat = pytest.importorskip("nbclient"), pytest.importorskip("nbformat")
    for name, value in {"BERT_REPRO_TABLE": "table5", "BERT_REPRO_SCALE": "smoke", "OMP_NUM_THREADS": "1",
                        "BERT_REPRO_RUNS_DIR": str(table5_run / "runs"),
                        "BERT_REPRO_RESULTS_DIR": str(table5_run / "results"),
                        "BERT_REPRO_SET": shlex.join(SHRINK)}.items():
        monkeypatch.setenv(name, value)  # the kernel inherits this process's environment
    nb = nbformat.read(REPO / "notebooks" / "tables.ipynb", as_version=4)
    assert not any(c.get("outputs") for c in nb.cells), "commit notebooks/tables.ipynb without outputs"
    # "python3" is ipykernel's own kernel: jupyter_client starts it with this interpreter (sys.executable)
    nbclient.NotebookClient(nb, kernel_name="python3", timeout=300,
                            resources={"metadata": {"path": str(REPO / "notebooks")}}).execute()

    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    tagged = {tag: c for c in nb.cells for tag in c.metadata.get("tags", [])}
    cells = csv_cells(table5_run)
    lines = outputs_text(tagged["table"]).splitlines()
    mrpc = cells["mrpc_acc"]
    mrpc_line = next(line for line in lines if "bert_base" in line and "mrpc_acc" in line)
    for value in (float(mrpc["ours"]), float(mrpc["paper"])):
        assert f"{value:.2f}" in mrpc_line
    assert f"{float(mrpc['diff']):+.2f}" in mrpc_line

    spread = outputs_text(tagged["spread"]).splitlines()
    root = table5_run / "runs" / "table5" / "smoke" / "finetune" / "bert_base" / "mrpc"
    for job in ("optim.lr-0.001", "optim.lr-0.0001"):
        run = json.loads((root / job / "results.json").read_text())
        line = next(line for line in spread if "mrpc_acc" in line and f" {job} " in line)
        assert f"{100 * run['metrics']['final']['val/acc']:.2f}" in line and "complete" in line
    assert any("image/png" in o.get("data", {}) for o in outputs)


ON_RAY = ["--launcher", "ray",
          "--set=launchers.ray.ray.init={num_gpus: 2, num_cpus: 2, log_to_driver: false}",
          "--set=launchers.ray.pretrain.ray={num_gpus: 1, num_cpus: 1}",
          "--set=launchers.ray.finetune.ray={num_gpus: 1, num_cpus: 1}"]  # two GPUs declared on this CPU


@pytest.mark.slow
def test_a_moved_table_reruns_nothing_and_a_checkpoint_replaced_in_place_reruns_on_ray(table5_run, tmp_path):
    """The finished table at another path (the first moved away meanwhile) launches nothing: a fine-tuning is
    known by its pre-training checkpoint's identity and step, not its path. The same weights written over that
    checkpoint at a later step make its fine-tunings new runs, run here as Ray tasks (LAUNCHER=ray on this
    CPU): the same cells as the local launcher's."""
    pytest.importorskip("ray", reason="LAUNCHER=ray needs Ray: pip install -e '.[ray]'")
    moved, away = tmp_path / "elsewhere", table5_run.with_name(table5_run.name + "-away")
    shutil.copytree(table5_run, moved)
    table5_run.rename(away)  # nothing may read the first folder
    try:
        proc = tables(moved, "run", "table5", "--scale", "smoke")
    finally:
        away.rename(table5_run)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "launching" not in proc.stderr and "moved to" not in proc.stdout
    cells = {c: (v["ours"], v["status"]) for c, v in csv_cells(table5_run).items()}
    assert {c: (v["ours"], v["status"]) for c, v in csv_cells(moved).items()} == cells  # collected as its own

    last = next((moved / "runs" / "pretrain" / "smoke").iterdir()) / "default" / "checkpoints" / "last.ckpt"
    checkpoint = torch.load(last, weights_only=True)
    checkpoint["global_step"] += 1
    torch.save(checkpoint, last)
    proc = tables(moved, "run", "table5", "--scale", "smoke", *ON_RAY)
    if "Ray did not start" in proc.stderr:
        pytest.skip(proc.stderr.strip().splitlines()[-1])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count("init.step: was 2, now 3; moved to") == 2  # both MRPC jobs, nothing else
    assert "finetune/bert_base/mrpc: 2 jobs to Ray" in proc.stderr
    mrpc = moved / "runs" / "table5" / "smoke" / "finetune" / "bert_base" / "mrpc"
    assert {json.loads(p.read_text())["init_identity"]["step"] for p in mrpc.glob("*/results.json")} == {3}
    assert {c: (v["ours"], v["status"]) for c, v in csv_cells(moved).items()} == cells  # the same weights


@pytest.mark.slow
def test_a_relaunch_with_other_epochs_reruns_the_fine_tuning_alone_and_rebuilds_the_table(table5_run):
    """After the tests above: the finished table's --set changed, as a researcher would edit it."""
    root = table5_run / "runs" / "table5" / "smoke" / "finetune" / "bert_base" / "mrpc"
    store = next((table5_run / "runs" / "pretrain" / "smoke").iterdir()) / "default"
    before = (store / "results.json").stat().st_mtime_ns
    proc = tables(table5_run, "run", "table5", "--scale", "smoke", "--set=finetune_overrides.optim.epochs=2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("optim.epochs: was 1, now 2; moved to") == 2
    assert "step 4/4 | epoch 2/2" in proc.stdout + proc.stderr  # the runs' progress lines, in the pipe
    assert (store / "results.json").stat().st_mtime_ns == before  # the pre-training is not rerun
    for job in ("optim.lr-0.001", "optim.lr-0.0001"):
        assert json.loads((root / job / "results.json").read_text())["config"]["optim"]["epochs"] == 2
        kept = list((root / job / ".previous").glob("*/results.json"))
        assert [json.loads(k.read_text())["config"]["optim"]["epochs"] for k in kept] == [1]
    saved = json.loads((table5_run / "results" / "table5.json").read_text())
    selected = saved["parts"]["main"]["rows"][0]["cells"]["mrpc_acc"]["run"]
    assert selected.startswith(str(root)) and ".previous" not in selected
