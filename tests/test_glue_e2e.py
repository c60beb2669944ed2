"""src/train.py on GLUE end to end (CPU, offline): a Hydra sweep, selection, the server's submission files,
MNLI's two dev sets and AX, and the real-data acceptance run of a pre-trained checkpoint."""

import json
import zipfile
from pathlib import Path

import pytest
import torch

from bert_repro import selection

from .conftest import run_py
from .helpers import VARIED, call_in_new_process, validate_on_one_and_two_ranks

TINY = ["model=tiny", "logger=csv", "trainer.enable_progress_bar=false", "data.batch_size=16",
        "data.max_train_examples=64", "optim.epochs=1"]


def run(*args, module=None, timeout=600):
    proc = run_py(*args, module=module, timeout=timeout)
    return proc, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def sweep(tmp_path_factory, shared_data, minilm_dir):
    """MRPC lr x seed as a Hydra multirun; WNLI (the majority class) beside it."""
    tmp = tmp_path_factory.mktemp("glue_e2e")
    common = [*TINY, f"data.tokenizer={minilm_dir}", f"paths.cache_dir={tmp / 'cache'}",
              f"paths.shared_data={shared_data}"]
    proc, out = run("-m", "task=mrpc", *common, "optim.lr=1e-3,1e-5", "seed=1,2",
                    f"hydra.sweep.dir={tmp}/sweep")
    assert proc.returncode == 0, out[-3000:]
    proc, out = run("task=wnli", *common, f"hydra.run.dir={tmp}/sweep/wnli")
    assert proc.returncode == 0, out[-3000:]
    return tmp / "sweep"


def results_of(sweep, task):
    found = {str(p.parent): json.loads(p.read_text()) for p in sweep.glob("*/results.json")}
    return {d: r for d, r in found.items() if r["task"] == task}


def test_sweep_runs_each_combination_in_its_own_folder(sweep):
    mrpc = results_of(sweep, "mrpc").values()
    assert sorted((r["config"]["optim"]["lr"], r["seed"]) for r in mrpc) == [(1e-5, 1), (1e-5, 2), (1e-3, 1),
                                                                             (1e-3, 2)]
    for r in mrpc:
        final = r["metrics"]["final"]
        assert {"val/acc", "val/f1", "val/top_class_share"} <= set(final) and r["data_sizes"]["dev"] == 408
        epoch = r["metrics"]["per_epoch"][-1]
        assert epoch["train/padding_waste"] > 0 and epoch["train/real_tokens"] > 0 and "val/f1" in epoch
    # four runs, one tokenization
    assert len(list((sweep.parent / "cache" / "glue").glob("tokens-mrpc-train-*.arrow"))) == 1
    for wnli in results_of(sweep, "wnli").values():
        assert wnli["predict_majority"] and wnli["global_step"] == 0 and wnli["degenerate"] is None
        assert wnli["metrics"]["final"]["val/acc"] == pytest.approx(40 / 71)  # dev's majority "0": 40 of 71


def test_select_then_submit(sweep, tmp_path, capsys):
    torch.set_num_threads(1)  # the test predictions of a tiny model, on a shared machine
    out = str(tmp_path / "sel")
    assert selection.main([str(sweep), "--submit", "--out", out]) == 0, capsys.readouterr().err
    summary = json.loads((tmp_path / "sel" / "selection.json").read_text())
    mrpc = next(e for e in summary["selection"] if e["setting"]["task"] == "mrpc")
    runs = results_of(sweep, "mrpc")
    healthy = [d for d, r in runs.items() if not r["degenerate"]] or list(runs)
    f1 = {d: runs[d]["metrics"]["final"]["val/f1"] for d in runs}
    assert mrpc["selected"] in healthy and f1[mrpc["selected"]] == max(f1[d] for d in healthy)
    with zipfile.ZipFile(tmp_path / "sel" / "submission.zip") as archive:  # both predicted after the fact
        assert sorted(archive.namelist()) == ["MRPC.tsv", "WNLI.tsv"]
        mrpc_lines = archive.read("MRPC.tsv").decode().splitlines()  # from the selected run's best.ckpt
        wnli_lines = archive.read("WNLI.tsv").decode().splitlines()  # the majority class of WNLI train
    assert mrpc_lines[0] == "index\tprediction" and len(mrpc_lines) == 1 + 1725
    assert {line.split("\t")[1] for line in mrpc_lines[1:]} <= {"0", "1"}
    assert len(wnli_lines) == 1 + 146 and {line.split("\t")[1] for line in wnli_lines[1:]} == {"0"}
    assert "CoLA.tsv" in summary["submission"]["missing"] and "AX.tsv" in summary["submission"]["missing"]
    assert selection.main([str(sweep), "--restarts", "--out", str(tmp_path / "restarts")]) == 0
    restarts = json.loads((tmp_path / "restarts" / "selection.json").read_text())["selection"]
    entry = next(e for e in restarts if e["setting"]["task"] == "mrpc")
    assert entry["seeds"] == [1, 2] and entry["restarts"]["val/f1"]["n"] == 2


def test_mnli_two_dev_sets_and_ax(tmp_path, minilm_dir, shared_data):
    """MNLI in its original layout (the format sample), with an AX file: matched/mismatched metrics, three
    server files."""
    sample = shared_data / "glue" / "MNLI_sample"
    ax = tmp_path / "diagnostic.tsv"
    rows = [line.split("\t") for line in (sample / "test_matched.tsv").read_text().splitlines()[1:]]
    ax.write_text("index\tsentence1\tsentence2\n"
                  + "".join(f"{i}\t{r[8]}\t{r[9]}\n" for i, r in enumerate(rows * 2)))
    files = ",".join(f"{split}:{sample / split}.tsv" for split in
                     ("train", "dev_matched", "dev_mismatched", "test_matched", "test_mismatched"))
    proc, out = run("task=mnli", *TINY, f"data.tokenizer={minilm_dir}", f"data.files={{{files},ax:{ax}}}",
                    "test=true", f"paths.cache_dir={tmp_path / 'cache'}", f"hydra.run.dir={tmp_path / 'run'}")
    assert proc.returncode == 0, out[-3000:]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert ({"val/mnli_m_acc", "val/mnli_mm_acc", "val/mnli_m_loss", "val/mnli_mm_loss"}
            <= set(results["metrics"]["final"]))
    predictions = tmp_path / "run" / "test_predictions"
    assert sorted(p.name for p in predictions.iterdir()) == ["AX.tsv", "MNLI-m.tsv", "MNLI-mm.tsv"]
    ax_lines = (predictions / "AX.tsv").read_text().splitlines()
    assert len(ax_lines) == 3 and ax_lines[1].split("\t")[1] in ("entailment", "neutral", "contradiction")


def validate_on_two_ranks(minilm_dir: str, glue_dir: str, out: str) -> None:
    """Dev metrics of one set of weights on 1 process and on 2 DDP ranks (CPU, gloo), written to ``out``."""
    from bert_repro.data.glue import GlueDataModule
    from bert_repro.tasks.classification import SequenceClassificationModule

    runs = validate_on_one_and_two_ranks(
        lambda: SequenceClassificationModule(VARIED, {}, "rte", 2),
        lambda: GlueDataModule("rte", glue_dir=glue_dir, tokenizer=minilm_dir, cache_dir=f"{out}.cache",
                               batch_size=16), out)
    Path(out).write_text(json.dumps([metrics for metrics, _, _ in runs]))


def test_dev_metrics_under_ddp_count_each_example_once(tmp_path, minilm_dir, shared_data):
    """RTE dev has 277 rows: a sampler that evens out the ranks would score one twice; ours scores each
    once."""
    out = tmp_path / "metrics.json"
    call_in_new_process("tests.test_glue_e2e.validate_on_two_ranks", str(minilm_dir),
                        str(shared_data / "glue"), str(out))
    single, ddp = json.loads(out.read_text())
    # predictions vary, so a repeated example would move the numbers
    assert single["val/top_class_share"] < 0.9
    for name in ("val/acc", "val/loss", "val/top_class_share"):
        assert ddp[name] == pytest.approx(single[name], abs=1e-6), name


def test_minilm_fine_tunes_real_sst2_well_above_chance(tmp_path, minilm_dir, shared_data):
    """Acceptance: all-MiniLM-L6-v2 as init=, 384 real SST-2 sentences, 24 steps; dev carved from
    train."""
    proc, out = run("task=sst2", "model=minilm_l6", f"init={minilm_dir}", "logger=csv",
                    "trainer.enable_progress_bar=false", "data.dev_from_train=200",
                    "data.max_train_examples=384", "data.batch_size=16", "optim.epochs=1", "optim.lr=2e-4",
                    f"paths.shared_data={shared_data}", f"paths.cache_dir={tmp_path / 'cache'}",
                    f"hydra.run.dir={tmp_path / 'run'}", "speed.unpad=true",
                    "speed.activation_checkpointing=true")  # speed only: same science
    assert proc.returncode == 0, out[-3000:]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["missing_heads"] == ["classifier"] and results["global_step"] == 24
    perf = results["perf"]  # a CPU has no peak to divide by: model FLOP/s, and no MFU
    assert perf["peak_source"] is None and perf["mfu"] is None and perf["tflops_per_device"] > 0
    assert 0 < perf["step_share"] < 1 and perf["step_s"] < results["wall_time_s"]  # start-up is not a step
    final = results["metrics"]["final"]
    assert final["val/acc"] > 0.70 and final["val/top_class_share"] < 0.8, final  # chance: 0.5
