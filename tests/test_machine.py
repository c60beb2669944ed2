"""A table checks the machine before it launches: a scale whose trainer needs CUDA, or whose data need the
Hub, is refused before the first job on a machine without them, naming what is missing and the ways out, the
collected tables left as they were. A collect writes no verdict over runs that did not finish, and never puts
a table with fewer finished cells in a fuller one's place without saying so (the earlier one kept)."""

import json
import logging

import pytest
import torch
from huggingface_hub import constants
from omegaconf import OmegaConf

from bert_repro.tables import __main__ as cli
from bert_repro.tables import machine, runner
from bert_repro.tables.collect import collect, comparisons
from bert_repro.tables.compose import compose_run, composing_jobs
from bert_repro.tables.render import PREVIOUS, write_all
from bert_repro.tables.spec import build

from .test_table_stats import REFERENCE, fill


@pytest.fixture
def table5(tmp_path):
    """Table 5 at smoke scale, one seed, every job finished."""
    table = build("table5", "smoke", tmp_path / "runs")
    fill(table, lambda row, task, seed: ({"val/acc": 0.8, "val/f1": 80.0, "val/mnli_m_acc": 0.8}, "val/acc"))
    return table


@pytest.mark.slow
def test_a_budget_table_on_a_cpu_machine_without_the_hub_is_refused_before_any_job(
        tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # as conftest's HF_HUB_OFFLINE=1: no Hub here
    monkeypatch.setenv("BERT_REPRO_CACHE", str(tmp_path / "cache"))  # nothing cached
    launched = []
    monkeypatch.setattr(runner, "_launch", lambda *args, **kwargs: launched.append(args) or (1, ""))
    results = tmp_path / "results"
    results.mkdir()
    earlier = {ext: f"an earlier table5.{ext}\n" for ext in ("md", "csv", "tex", "json")}
    for ext, text in earlier.items():
        (results / f"table5.{ext}").write_text(text)

    # MNLI (from the Hub) stands for the GLUE columns, which take its path: the check composes each job
    glue_alike = [f"--set=columns.{column}=null" for column in ("qnli_acc", "mrpc_acc", "sst2_acc")]
    code = cli.main(["run", "table5", "--scale", "budget", "--runs-dir", str(tmp_path / "runs"),
                     "--results-dir", str(results), *glue_alike])
    said = capsys.readouterr().err
    assert code == 2 and launched == []
    assert "cannot run on this machine" in said and "a CUDA GPU" in said and "pretrain/none/phase1" in said
    assert "the Hugging Face Hub (HF_HUB_OFFLINE is set)" in said
    assert "nyu-mll/glue" in said and "wikimedia/wikipedia" in said and str(tmp_path / "cache") in said
    assert "ACTION=rehearse" in said and "BERT_REPRO_CACHE" in said and "--launcher slurm" in said
    assert {ext: (results / f"table5.{ext}").read_text() for ext in earlier} == earlier
    assert sorted(p.name for p in results.iterdir()) == sorted(f"table5.{ext}" for ext in earlier)
    assert not (tmp_path / "runs" / "table5").exists()  # no folder made, nothing moved


@pytest.mark.slow
def test_the_hub_data_sets_a_run_reads_are_those_with_no_local_copy():
    def read(*args):
        with composing_jobs():
            data = OmegaConf.to_container(compose_run(list(args)).data, resolve=True)
        return [path for path, _ in machine.hub_datasets(data)]

    assert read("task=mnli", "data.glue_dir=null") == ["nyu-mll/glue"]
    assert read("task=mrpc") == []  # ../shared/data's GLUE files
    assert read("task=squad_v1", "data.squad_dir=null") == ["rajpurkar/squad"]
    assert read("task=pretrain", "scale=budget") == ["wikimedia/wikipedia", "bookcorpus/bookcorpus"]
    assert read("task=pretrain", "data.corpus=builtin:pydoc") == []


@pytest.mark.parametrize("elsewhere", [{"common": {"hydra/launcher": "submitit_slurm"}},
                                       {"ray": {"address": "ray://head:10001"}}])
def test_a_table_sent_to_a_cluster_asks_nothing_of_this_machine(monkeypatch, tmp_path, elsewhere):
    table = build("table5", "budget", tmp_path)  # never composed: the check stops at the launcher
    monkeypatch.setattr(machine, "composing_jobs", None)
    assert machine.refusal(table, {name: [([], None)] for name in table.sweeps}, elsewhere) is None


@pytest.mark.slow
def test_a_comparison_whose_cells_did_not_finish_has_no_verdict_but_not_run_and_why(tmp_path):
    table = build("table5", "smoke", tmp_path / "runs")  # one seed: a finished comparison is inconclusive
    metrics = {"val/acc": 0.8, "val/f1": 80.0, "val/mnli_m_acc": 0.8}
    fill(table, lambda row, task, seed: ({k: v + seed / 100 for k, v in metrics.items()}, "val/acc"))
    for sweep in (s for s in table.sweeps.values() if s.name.startswith("finetune/no_nsp/")):
        for _, folder in sweep.jobs():
            (folder / "results.json").unlink()
    found = [c for c in comparisons(table, collect(table, REFERENCE), REFERENCE)["main"]
             if "no_nsp" in (c["a"], c["b"])]
    assert found and {c["verdict"] for c in found} == {"not run"}
    assert all(c["why"].startswith("1 of its 2 cells have no number: not run yet") for c in found)


@pytest.mark.slow
def test_a_table_with_fewer_finished_cells_says_so_and_keeps_the_fuller_one(table5, tmp_path, caplog):
    results = tmp_path / "results"
    write_all(table5, collect(table5, REFERENCE), REFERENCE, results)
    fuller = (results / "table5.json").read_text()
    for _, folder in table5.sweeps["finetune/no_nsp/mrpc"].jobs():
        (folder / "results.json").unlink()
    with caplog.at_level(logging.WARNING):
        write_all(table5, collect(table5, REFERENCE), REFERENCE, results)
    kept = list((results / PREVIOUS).glob("*/table5.json"))
    assert [k.read_text() for k in kept] == [fuller]
    cells = sum(c["status"] == "ok" for row in json.loads(fuller)["parts"]["main"]["rows"]
                for c in row["cells"].values())
    assert f"{cells - 1} finished cells, fewer than the {cells} of the table it replaces" in caplog.text
    write_all(table5, collect(table5, REFERENCE), REFERENCE, results)  # as many as the last: nothing said
    assert len(list((results / PREVIOUS).glob("*/table5.json"))) == 1
