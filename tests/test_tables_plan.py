"""What a table will run and cost before it runs (ACTION=plan), the spec checks behind it, and the runner's
progress lines. The rehearsals of a budget and a paper plan on this CPU (ACTION=rehearse) are
test_rehearse_figure4.py and test_rehearse_table5.py."""

import dataclasses
import heapq
import io
import json
import os
import re
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from bert_repro.benchmarks.lengths import measure_lengths
from bert_repro.data.batching import PadCollator
from bert_repro.tables import SCALES, TABLES, runner
from bert_repro.tables import __main__ as cli
from bert_repro.tables import plan as planning
from bert_repro.tables import progress as progress_module
from bert_repro.tables.collect import checkpoint_of
from bert_repro.tables.compose import composing_jobs
from bert_repro.tables.plan import make_plan
from bert_repro.tables.progress import TableProgress
from bert_repro.tables.runner import job_config, run_table, sweep_costs
from bert_repro.tables.spec import TableError, build, load_spec

from .test_tables import write_results


@pytest.mark.slow
def test_a_step_checkpoint_the_schedule_never_writes_is_refused(tmp_path):
    """A made-up broken Figure 4: budget saves step-<N>.ckpt every 100k of 1M steps."""
    for bad, why in [("step-150000.ckpt", "a multiple of 100000"), ("step-1100000.ckpt", "0 < N <= 1000000"),
                     ("best-5.ckpt", "expected last.ckpt or step-<N>.ckpt")]:
        with pytest.raises(TableError, match="never written|expected last.ckpt") as err:
            build("figure4", "budget", tmp_path, sets=[f"columns.k500k.checkpoint={bad}"])
        assert why in str(err.value) and "finetune/mlm/mnli_k500k" in str(err.value)
    with pytest.raises(TableError, match="keeps no step checkpoints"):  # a schedule that saves none
        build("figure4", "smoke", tmp_path,
              sets=["pretrain_overrides.scale.pretrain.checkpoint_every_n_steps=null"])


@pytest.mark.slow
def test_a_built_table_is_a_frozen_value_and_the_rehearsal_derives_its_own(tmp_path, monkeypatch):
    """Building returns finished values: a sweep, a part and the table refuse a write, and the rehearsal's
    shrunk sweeps are new values (dataclasses.replace) beside the ones it built, which stay as built."""
    from bert_repro.tables import rehearse

    table = build("figure4", "smoke", tmp_path)
    for value, name in [(table.sweeps["finetune/mlm/mnli_k100"], "checkpoint"), (table.parts[0], "x"),
                        (table, "sweeps")]:
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(value, name, None)
    made = []
    monkeypatch.setattr(rehearse, "build", lambda *a, **k: made.append((build(*a, **k), a, k)) or made[-1][0])
    small = rehearse.shrink(table, tmp_path, 100)
    (built, args, kwargs), = made
    assert built.sweeps == build(*args, **kwargs).sweeps  # the shrink wrote nothing into what build made
    shrunk, real = small.sweeps["finetune/mlm/mnli_k100"], built.sweeps["finetune/mlm/mnli_k100"]
    assert (shrunk.checkpoint, real.checkpoint) == ("step-1.ckpt", "step-100.ckpt")
    assert shrunk.overrides["init"].endswith("/step-1.ckpt")
    assert real.overrides["init"].endswith("/step-100.ckpt")
    assert shrunk.needs is small.sweeps["pretrain/mlm"] and small.spec["logger"] == "csv"


@pytest.mark.slow
def test_budget_and_paper_pre_train_in_two_phases_and_figure4_x_is_the_checkpoint_step(tmp_path):
    for scale in ("budget", "paper"):
        table = build("figure4", scale, tmp_path)
        one, two = table.sweeps["pretrain/mlm/phase1"], table.sweeps["pretrain/mlm"]
        phases = (one.overrides["experiment"], two.overrides["experiment"])
        assert phases == ("pretrain_phase1", "pretrain_phase2") and two.needs is one
        assert two.overrides["ckpt_path"] == str(one.jobs()[0][1] / "checkpoints/last.ckpt")
        x = [table.parts[0].x[c] for c in table.parts[0].columns]
        assert x == [200_000, 500_000, 600_000, 800_000, 1_000_000]  # §5.3's +1.0 is 1M vs 500k
        # 200k ... 800k are written by phase 1 (900k steps), 1M (last.ckpt) by phase 2
        assert table.sweeps["finetune/ltr/mnli_k800k"].needs is table.sweeps["pretrain/ltr/phase1"]
        assert table.sweeps["finetune/ltr/mnli_k1m"].needs is table.sweeps["pretrain/ltr"]
    smoke = build("figure4", "smoke", tmp_path)
    assert "pretrain/mlm/phase1" not in smoke.sweeps
    assert [smoke.parts[0].x[c] for c in smoke.parts[0].columns] == [100, 200, 300]


@pytest.mark.slow
def test_the_schedule_is_read_from_the_configs_hydra_composes_for_the_phases(tmp_path):
    """Phase 1's length and steps as conf/experiment/pretrain_phase1.yaml composes them with the table's
    overrides: a longer phase 1 moves the trained positions and which phase writes step-800000.ckpt."""
    sets = ["pretrain_overrides.scale.pretrain.two_phase.phase1_seq_length=256",
            "pretrain_overrides.scale.pretrain.two_phase.phase1_steps=700000"]
    table = build("figure4", "budget", tmp_path, sets=sets)
    schedule = table.sweeps["pretrain/mlm"].schedule
    assert (schedule.trained_length(1), schedule.trained_length(2)) == (256, 512)
    assert schedule.phase1_steps == 700_000
    assert table.sweeps["finetune/mlm/mnli_k800k"].needs is table.sweeps["pretrain/mlm"]  # phase 2's now
    with pytest.raises(TableError, match=r"pretrain/mlm: does not compose.*no_such_key"):
        build("figure4", "budget", tmp_path, sets=["pretrain_overrides.no_such_key=1"])


@pytest.mark.slow
def test_table5_paper_plan_lists_both_phases_and_every_job_and_writes_plan_json(tmp_path, capsys):
    args = ["plan", "table5", "--scale", "paper", "--accelerator", "a100", "--runs-dir", str(tmp_path)]
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    assert "assumed 30% for H<=768" in out and "total on a100" in out and "total on h200" in out
    plan = json.loads((tmp_path / "table5" / "paper" / "plan.json").read_text())
    assert {"runs", "total_gpu_hours", "accelerator", "totals"} <= set(plan) and plan["accelerator"] == "a100"
    fields = ("name", "kind", "phase", "steps", "seq_length", "tokens", "flops", "gpu_hours", "compute_hours",
              "comm_hours", "eval_hours", "wall_hours", "prep_hours", "disk_gb", "devices", "gpus",
              "interconnect", "folder", "after")
    assert all(tuple(r) == fields for r in plan["runs"]) and set(plan["totals"]) == {"h100", "h200", "a100"}
    for r in plan["runs"]:
        assert r["gpu_hours"] == pytest.approx(r["compute_hours"] + r["comm_hours"] + r["eval_hours"])
        assert r["eval_hours"] > 0 and r["disk_gb"] > 0
    pretrain = [r for r in plan["runs"] if r["kind"] == "pretrain"]
    phases = [(r["phase"], r["steps"], r["seq_length"]) for r in pretrain[:2]]
    assert phases == [(1, 900_000, 128), (2, 100_000, 512)]
    assert len(pretrain) == 6 and pretrain[0]["tokens"] == 900_000 * 256 * 128
    # the layout of conf/scale/paper.yaml: one node of 8 GPUs, bf16 gradients over NVLink, compute dominating
    assert {(r["devices"], r["interconnect"]) for r in pretrain} == {(8, "nvlink")}
    assert 0 < pretrain[0]["comm_hours"] < pretrain[0]["compute_hours"] / 5
    finetune = [r for r in plan["runs"] if r["kind"] == "finetune"]
    assert len(finetune) == 4 * (4 * 18 + 1)  # 4 rows x (4 GLUE grids of 18, v2 A.3 + SQuAD's one fixed run)
    squad = [r for r in finetune if "/squad_v1/" in r["name"]]
    assert len(squad) == 4 and {r["seq_length"] for r in squad} == {384}
    # 87,599 questions / 32 x 3 epochs (Table 2's recipe)
    assert squad[0]["steps"] == -(-87_599 // 32) * 3
    assert plan["total_gpu_hours"] == pytest.approx(sum(r["gpu_hours"] for r in plan["runs"]))
    # at 312 TFLOP/s x 30%: phase 1 is 900k x 256 x 128 tokens of BERT-base, some 50 A100-hours
    assert 40 < pretrain[0]["gpu_hours"] < 60


@pytest.mark.slow
def test_fine_tuning_beyond_the_trained_positions_is_refused_at_plan_time(tmp_path):
    """Figure 4 from step-200000.ckpt (phase 1: positions trained up to 128) at 256 tokens."""
    table = build("figure4", "budget", tmp_path, sets=["finetune_overrides.data.max_seq_length=256"])
    refused = r"max_seq_length=256 from step-200000.ckpt.*trained up to 128 tokens"
    with pytest.raises(TableError, match=refused):
        make_plan(table)


@pytest.mark.slow
def test_the_demo_plans_and_fine_tunes_within_its_pre_training_length(tmp_path):
    """`make demo` pre-trains at 32 tokens, so its fine-tuning runs are held to 32."""
    plan = make_plan(build("table5_demo", "smoke", tmp_path))
    lengths = {(r["kind"], r["seq_length"]) for r in plan["runs"]}
    assert lengths == {("pretrain", 32), ("finetune", 32)} and len(plan["runs"]) == 3 + 4 * 2 * 5
    # the left-to-right LM predicts the 31 next tokens of a 32-token sequence, the masked LM 5 (1,000 steps of
    # 128): only their heads differ, 6 (H^2 + H V) FLOPs a prediction, V the WordPiece's 8,000 at most
    runs = {r["name"]: r for r in plan["runs"]}
    extra = runs["pretrain/ltr_no_nsp/default"]["flops"] - runs["pretrain/none/default"]["flops"]
    assert extra == pytest.approx(6 * (128 * 128 + 128 * 8000) * 1000 * 128 * (31 - 5), rel=1e-6)
    # + BiLSTM adds its one-layer BiLSTM (H a direction) to the LTR row's work, so the runner starts that
    # sweep first of the fine-tunings, not last beside an idle slot
    lstm, plain = (runs[f"finetune/{row}/pydoc_punct/seed-1"] for row in ("ltr_no_nsp_bilstm", "ltr_no_nsp"))
    assert lstm["flops"] - plain["flops"] == pytest.approx(6 * lstm["tokens"] * 2 * 4 * 128 * (128 + 128))
    costs = sweep_costs(plan)
    assert max((c, n) for n, c in costs.items() if n.startswith("finetune/"))[1] == \
        "finetune/ltr_no_nsp_bilstm/pydoc_punct"
    longer = build("table5_demo", "smoke", tmp_path, sets=["finetune_overrides.data.max_seq_length=64"])
    with pytest.raises(TableError, match=r"max_seq_length=64 .*trained up to 32 tokens"):
        make_plan(longer)


@pytest.mark.slow
def test_a_row_whose_ablation_does_not_exist_fails_the_plan_naming_it(tmp_path):
    """Rows that differ only in their ablation are each composed, not taken from a cached neighbour."""
    table = build("table7", "budget", tmp_path, inits={"*": "/ckpt/given"},
                  sets=["rows.last_hidden.overrides.ablation=feature_lats"])
    with pytest.raises(TableError, match="finetune/last_hidden/conll2003 .*does not compose.*feature_lats"):
        make_plan(table)


@pytest.mark.slow
def test_a_run_composed_in_hydras_two_steps_is_the_config_hydra_composes():
    """Build and plan compose a run's config choices once and set its values on that (compose.compose_run):
    the same config, interpolations included, as Hydra's composition of the run."""
    from hydra import compose
    from omegaconf import OmegaConf

    from bert_repro.tables.compose import compose_run, composing

    args = ["scale=budget", "task=conll2003", "ablation=feature_concat_last_four", "model=L6_H768_A3",
            "optim.lr=3e-5", "seed=2", "init=/ckpt/given", "+trainer.num_sanity_val_steps=0"]
    with composing():
        derived, whole = compose_run(args), compose("train", overrides=args)
    assert OmegaConf.to_container(derived) == OmegaConf.to_container(whole)
    features = OmegaConf.to_container(derived.module.features, resolve=True)
    assert features["layers"] == [-4, -3, -2, -1] and derived.model.num_heads == 3
    assert derived.data.max_seq_length == 512  # ${model.max_position}, resolved on the derived config


def test_a_composition_read_back_from_the_file_cache_is_the_one_composed(tmp_path, monkeypatch):
    """compose_once's .cache/compositions file keeps integer keys (assumed_mfu's widths), floats and
    ``${...}`` interpolations unresolved: the next process reads the config this one composed."""
    from omegaconf import OmegaConf

    from bert_repro.tables import compose as composition

    monkeypatch.setattr(composition, "CACHE", tmp_path)
    monkeypatch.setattr(composition, "_COMPOSED", {})
    calls = [("tables", ["table=table5", "scale=budget"]), ("train", ["task=mrpc", "model=tiny"])]
    with composition.composing():
        composed = [composition.compose_once(config, args) for config, args in calls]
        composition._COMPOSED.clear()
        monkeypatch.setattr(composition, "compose", lambda *a, **k: pytest.fail("composed again"))
        read = [composition.compose_once(config, args) for config, args in calls]
    assert len(list(tmp_path.glob("*.yaml"))) == 2
    for first, again in zip(composed, read):
        assert OmegaConf.to_yaml(again) == OmegaConf.to_yaml(first)
        assert OmegaConf.is_readonly(again) and OmegaConf.is_struct(again)
    assert 768 in read[0].table.assumed_mfu and OmegaConf.is_interpolation(read[1].model, "causal")


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    """``planned(table, scale)``: the table as configured (every external checkpoint given) and its plan, made
    once for the tests of this module that read them; none changes either."""
    root, made = tmp_path_factory.mktemp("planned"), {}

    def table_and_plan(name: str, scale: str):
        if (name, scale) not in made:
            table = build(name, scale, root, inits={"*": "/ckpt/given"})
            made[name, scale] = table, make_plan(table)
        return made[name, scale]

    return table_and_plan


@pytest.mark.slow
@pytest.mark.parametrize("scale", SCALES)
def test_every_table_builds_and_plans_at_every_scale(scale, planned):
    """Every run of every table composes, its checkpoints exist in its schedule, its lengths fit its
    positions; pre-training runs in the shared store, fine-tuning in the table's folder, from the table's own
    pre-training where it has one, and a row's header names every checkpoint its fine-tunings start from."""
    for name in TABLES:
        table, plan = planned(name, scale)
        phases = [r["phase"] for r in plan["runs"] if r["kind"] == "pretrain"]
        assert phases == ([None] * len(phases) if scale == "smoke" else [1, 2] * (len(phases) // 2)), name
        assert all(r["steps"] > 0 and r["flops"] > 0 for r in plan["runs"]), name
        finetune = [s for s in table.sweeps.values() if s.stage == "finetune"]
        assert finetune, name
        assert all(s.overrides["task"] != "pretrain" and s.overrides.get("init") for s in finetune), name
        for sweep in finetune:
            if sweep.needs is not None:
                assert sweep.overrides["init"].startswith(str(sweep.needs.folder)), sweep.name
        runs = table.root.parents[1]  # <runs>/<table>/<scale>
        for sweep in table.sweeps.values():
            root = runs / "pretrain" / scale if sweep.stage == "pretrain" else table.root
            assert all(folder.is_relative_to(root) for _, folder in sweep.jobs()), sweep.name
        for part in table.parts:
            for key in part.rows:
                used = {s.checkpoint for s in finetune if s.name.startswith(f"finetune/{key}/") and s.needs}
                assert all(c in checkpoint_of(table, part, key) for c in used), (name, key, used)


def test_progress_prints_plain_lines_with_jobs_done_the_current_sweep_and_an_eta(tmp_path):
    folders = [tmp_path / str(i) for i in range(3)]
    stream = io.StringIO()
    with TableProgress(folders, stream=stream, every_s=60) as progress:
        progress.started("pretrain/none")
        progress.started("pretrain/no_nsp")  # side by side (sweeps_at_once)
        folders[0].mkdir()
        (folders[0] / "results.json").write_text("{}")
        progress.finished("pretrain/none")
        progress.started("finetune/bert_base/mrpc")
    lines = stream.getvalue().splitlines()
    assert lines[:2] == ["[0/3 jobs] running pretrain/none; ETA ?",
                         "[0/3 jobs] running pretrain/none, pretrain/no_nsp; ETA ?"]
    assert lines[2].startswith("[1/3 jobs] running pretrain/no_nsp; ETA ") and "?" not in lines[2]
    assert lines[3].startswith("[1/3 jobs] running pretrain/no_nsp, finetune/bert_base/mrpc; ETA ")
    assert lines[-1].startswith("[1/3 jobs] running done")


def _finish(folder, at: float, wall: float | None = None) -> None:
    """A job's result, written at ``at`` on the fake clock (its end: the file's time)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.json").write_text(json.dumps({"status": "complete", "wall_time_s": wall}))
    os.utime(folder / "results.json", (at, at))


def test_progress_eta_weighs_each_job_by_its_share_of_the_work(tmp_path):
    """A pre-training run worth 3 fine-tuning jobs, done in 30 s: the one job left is 10 s away (by job
    count it would say 30 s)."""
    pretrain, finetune = tmp_path / "pretrain", tmp_path / "finetune"
    progress = TableProgress([pretrain, finetune], stream=io.StringIO(),
                             weights={pretrain: 3.0, finetune: 1.0})
    progress.start = time.time() - 30
    _finish(pretrain, progress.start + 30)
    assert progress.line() == (1, 2, "0m10s")


def test_progress_eta_times_each_kind_of_job_by_its_own_finished_jobs(tmp_path, monkeypatch):
    """Fine-tuning runs at a fraction of pre-training's FLOP rate: a pre-training of 100 units took 90 s and a
    fine-tuning of 1 unit 10 s, so the fine-tuning left is 10 s, not 1/101 of the 100 s (about 1 s, what
    FLOPs alone would say); a job of a kind none of which has run goes at its stage's rate (fine-tuning
    another task), not pre-training's."""
    pretrain, done, left = tmp_path / "pretrain", tmp_path / "ft1", tmp_path / "ft2"
    kinds = {pretrain: "pretrain", done: "finetune: mrpc", left: "finetune: mrpc"}
    clock = [1000.0]
    monkeypatch.setattr(progress_module, "time", SimpleNamespace(time=lambda: clock[0]))
    progress = TableProgress([pretrain, done, left], stream=io.StringIO(),
                             weights={pretrain: 100.0, done: 1.0, left: 1.0}, kinds=kinds,
                             sweeps={"pretrain": [pretrain], "ft1": [done], "ft2": [left]})
    progress.started("pretrain")
    clock[0] += 90
    _finish(pretrain, clock[0])
    progress.finished("pretrain")
    progress.started("ft1")
    clock[0] += 10
    _finish(done, clock[0])
    progress.finished("ft1")
    assert progress.line() == (2, 3, "0m10s")
    progress.kinds[left] = "finetune: sst2"
    progress.weights[left] = 10.0  # 10 units at fine-tuning's 10 s a unit (at all jobs' rate: 9.9 s)
    assert progress.line() == (2, 3, "1m40s")


def _seconds(eta: str) -> float:
    """A progress line's ETA (1h02m, 12m05s) in seconds."""
    hours, minutes, seconds = re.fullmatch(r"(?:(\d+)h)?(\d+)m(?:(\d+)s)?", eta).groups()
    return 3600 * int(hours or 0) + 60 * int(minutes) + int(seconds or 0)


def test_the_smoke_tables_eta_is_within_1_5x_once_each_kind_of_job_has_run(tmp_path, monkeypatch, capsys):
    """`make table5 SCALE=smoke` through the runner on a fake clock, with no plan (the smoke table makes
    none): each sweep starts in 20 s, a pre-training runs 240 s, a fine-tuning its task's time (the LTR rows
    longer). Once a job of each kind (pre-training, fine-tuning each task) is done, every ETA is within 1.5x
    of what is really left."""
    table = build("table5", "smoke", tmp_path / "runs")
    task_s = {"mnli": 70, "qnli": 60, "mrpc": 35, "sst2": 45, "squad_v1": 100}
    row_x = {"bert_base": 1.0, "no_nsp": 1.0, "ltr_no_nsp": 1.1, "ltr_no_nsp_bilstm": 1.25}
    walls = {name: 240.0 if s.stage == "pretrain" else task_s[s.overrides["task"]] * row_x[name.split("/")[1]]
             for name, s in table.sweeps.items()}
    clock = [1000.0]
    monkeypatch.setattr(progress_module, "time", SimpleNamespace(time=lambda: clock[0]))
    monkeypatch.setattr(runner.warm, "prestart", lambda: None)

    def run_sweep(sweep, launcher, todo):
        clock[0] += 20 + walls[sweep.name]
        write_results(todo[0][1], sweep.overrides["task"], {"val/acc": 0.5})
        record = json.loads((todo[0][1] / "results.json").read_text())
        (todo[0][1] / "results.json").write_text(json.dumps({**record, "wall_time_s": walls[sweep.name]}))
        os.utime(todo[0][1] / "results.json", (clock[0], clock[0]))
        return {"skipped": 0, "complete": 1, "failed": 0}

    monkeypatch.setattr(runner, "run_sweep", run_sweep)
    runner._sweeps(table, None, {name: s.jobs() for name, s in table.sweeps.items()}, [None], None)
    order, seen = list(table.sweeps), set()
    etas = {}
    for line in capsys.readouterr().err.splitlines():
        if (m := re.match(r"\[(\d+)/23 jobs\] running (.+); ETA (\S+)$", line)) and m[2] != "-":
            etas.setdefault(int(m[1]), m[3])
    checked = 0
    for done in range(1, len(order)):
        seen.add(table.sweeps[order[done - 1]].kind)
        if len(seen) < len({s.kind for s in table.sweeps.values()}):
            continue
        left = sum(20 + walls[name] for name in order[done:])
        assert left / 1.5 <= _seconds(etas[done]) <= left * 1.5, (done, etas[done], left)
        checked += 1
    assert checked == 15  # from the first SQuAD fine-tuning (the last kind to run) on


@pytest.mark.slow
def test_a_smoke_table_is_planned_before_it_runs_so_its_eta_weighs_each_job(tmp_path, monkeypatch):
    """Every run is planned first, at smoke too: one slot (one core) needs no plan to order its sweeps, and
    the ETA without one takes every job alike, a pre-training for a fine-tuning."""
    given = {}

    def run_table(spec, launcher, force, dry_run, plan):
        given.update(jobs=spec.jobs(), plan=plan)
        raise TableError("stopped before the first job")

    monkeypatch.setattr(cli, "run_table", run_table)
    code = cli.main(["run", "table5_demo", "--scale", "smoke", "--runs-dir", str(tmp_path / "runs"),
                     "--results-dir", str(tmp_path / "results"), "--set=launchers.local.sweeps_at_once=1"])
    assert code == 2
    flops = {r["name"]: r["flops"] for r in given["plan"]["runs"]}
    assert set(flops) == set(given["jobs"]) and min(flops.values()) > 0
    assert flops["pretrain/none/default"] > 20 * flops["finetune/bert_base/pydoc_punct/seed-1"]


TIMELINES = json.loads((Path(__file__).parent / "table5_demo_smoke_timelines.json").read_text())


@pytest.mark.parametrize("timeline", TIMELINES, ids=["under-load", "quiet", "one-core"])
def test_the_demos_eta_replayed_from_a_real_run_is_within_1_5x_once_each_kind_has_run(timeline, tmp_path,
                                                                                       monkeypatch):
    """Real `make demo` runs (table5_demo at smoke; timeline["run"] says where) replayed on a fake clock: each
    sweep starts and each job ends when it did (its result's file time), each job weighed by its planned
    FLOPs. Once a job of each kind has ended (a pre-training, a PyDoc-Punct and a PyDoc-Next fine-tuning),
    every ETA printed is within 1.5x of what was really left, or within 15 s of it: at the end the last sweep
    runs alone, its jobs faster than two at once, which nothing before showed."""
    sweeps = timeline["sweeps"]
    jobs = {r["sweep"]: [tmp_path / r["sweep"] / str(i) for i in range(len(r["ends"]))] for r in sweeps}
    folders = [f for fs in jobs.values() for f in fs]
    clock = [0.0]
    monkeypatch.setattr(progress_module, "time", SimpleNamespace(time=lambda: clock[0]))
    stream = io.StringIO()
    progress = TableProgress(
        folders, stream=stream, weights={f: r["flops"] for r in sweeps for f in jobs[r["sweep"]]},
        kinds={f: r["kind"] for r in sweeps for f in jobs[r["sweep"]]}, sweeps=jobs,
        needs={r["sweep"]: r["needs"] for r in sweeps if r["needs"]}, at_once=timeline["slots"])
    events = sorted([(r["start"], 1, r["sweep"], None) for r in sweeps] +  # at a tie, ends first
                    [(end, 0, r["sweep"], i) for r in sweeps for i, end in enumerate(r["ends"])])
    last, kinds = max(e for r in sweeps for e in r["ends"]), {r["kind"] for r in sweeps}
    seen, checked = set(), 0
    with progress:
        for at, _, sweep, job in events:
            clock[0] = at
            if job is None:
                progress.started(sweep)
            else:
                _finish(jobs[sweep][job], at)
                seen.add(next(r["kind"] for r in sweeps if r["sweep"] == sweep))
                progress.finished(sweep) if job == len(jobs[sweep]) - 1 else progress.refresh()
            for line in stream.getvalue().splitlines():
                if (m := re.search(r"ETA (\d\S*)$", line)) and seen == kinds and last > at:
                    eta, real = _seconds(m[1]), last - at
                    assert 1 / 1.5 <= eta / real <= 1.5 or abs(eta - real) <= 15, (at, line, real)
                    checked += 1
            stream.seek(0)
            stream.truncate()
    assert checked >= 20  # every line from the first PyDoc-Next job on


def test_the_eta_under_ray_counts_each_job_in_its_share_of_the_cluster(tmp_path, monkeypatch):
    """LAUNCHER=ray on a fake clock: a pre-training on the whole cluster, then three fine-tuning sweeps handed
    to Ray at once, their jobs run four at a time in the order given, each run starting (Hydra writes its
    config) 2 s after Ray placed it. A job took from its run's start to its result, and the jobs left run in
    the cluster's four places: once a job of each kind has ended, every ETA is within 1.5x of what is left
    (timed as before, sweeps in four slots, each sweep's jobs one after another, it read 5x that)."""
    walls = {"pretrain/none": [300], "finetune/bert_base/sst2": [60, 66, 58, 62],
             "finetune/bert_base/mrpc": [40, 44, 38, 42, 40, 41],
             "finetune/no_nsp/mrpc": [45, 39, 41, 43, 40, 42]}
    jobs = {name: [tmp_path / name / str(i) for i in range(len(w))] for name, w in walls.items()}
    kinds = {f: "pretrain" if n.startswith("pretrain") else f"finetune: {n.rsplit('/', 1)[1]}"
             for n, fs in jobs.items() for f in fs}
    flops = {"pretrain": 100.0, "finetune: sst2": 2.0, "finetune: mrpc": 1.0}
    events = [(0, 1, "pretrain/none", None), (2, 2, "pretrain/none", 0), (302, 0, "pretrain/none", 0)]
    places = [303.0] * 4  # when each of Ray's four places is free, the fine-tunings handed over at 303
    for name in list(walls)[1:]:
        events.append((303, 1, name, None))
        for i, wall in enumerate(walls[name]):
            placed = heapq.heappop(places)
            heapq.heappush(places, placed + 2 + wall)
            events += [(placed + 2, 2, name, i), (placed + 2 + wall, 0, name, i)]
    clock = [0.0]
    monkeypatch.setattr(progress_module, "time", SimpleNamespace(time=lambda: clock[0]))
    stream = io.StringIO()
    progress = TableProgress([f for fs in jobs.values() for f in fs], stream=stream, kinds=kinds, sweeps=jobs,
                             weights={f: flops[k] for f, k in kinds.items()},
                             needs={n: "pretrain/none" for n in list(walls)[1:]}, at_once=4,
                             on_ray={"pretrain": 1, "finetune": 4})
    last, ended, checked = max(at for at, *_ in events), set(), 0
    with progress:
        for at, what, sweep, job in sorted(events):  # at a tie: ends, then sweeps starting, then runs
            clock[0], folder = at, jobs[sweep][job or 0]
            if what == 1:
                progress.started(sweep)
            elif what == 2:
                (folder / ".hydra").mkdir(parents=True)
                (folder / ".hydra" / "config.yaml").write_text("{}")
                os.utime(folder / ".hydra" / "config.yaml", (at, at))
                progress.refresh()
            else:
                _finish(folder, at)
                ended.add(folder)
                progress.finished(sweep) if set(jobs[sweep]) <= ended else progress.refresh()
            for line in stream.getvalue().splitlines():
                if (m := re.search(r"ETA (\d\S*)$", line)) and {kinds[f] for f in ended} == set(flops) \
                        and last > at:
                    assert 1 / 1.5 <= _seconds(m[1]) / (last - at) <= 1.5, (at, line, last - at)
                    checked += 1
            stream.seek(0)
            stream.truncate()
    assert checked >= 10  # every line from the first MRPC job's end on


def test_a_table_spec_is_not_a_runnable_experiment():
    """Table specs live in conf/table/: `src/train.py experiment=table5` fails instead of pre-training."""
    from hydra.errors import MissingConfigException

    from .test_config import compose_cfg

    with pytest.raises(MissingConfigException, match="experiment/table5"):
        compose_cfg(["experiment=table5"])


@pytest.mark.slow
def test_a_second_table_reuses_the_first_tables_pre_training_and_the_plan_counts_it_once(tmp_path, capsys):
    """Table 5's none and ltr_no_nsp are Figure 4's mlm and ltr (one folder of the pre-training store, named
    by the science keys): once Table 5 has trained them, Figure 4 launches no pre-training."""
    one = ["grid.optim.epochs=3", "grid.data.batch_size=32"]  # fewer compositions; the runs are the same
    first, second = (build(name, "budget", tmp_path, sets=one) for name in ("table5", "figure4"))
    assert second.sweeps["pretrain/mlm"].folder == first.sweeps["pretrain/none"].folder
    assert second.sweeps["pretrain/ltr"].folder == first.sweeps["pretrain/ltr_no_nsp"].folder
    assert first.sweeps["pretrain/no_nsp"].folder not in {s.folder for s in second.sweeps.values()}
    plan = make_plan([first, second])
    shared = plan["shared"]
    assert len([r for r in plan["runs"] if r["kind"] == "pretrain"]) == 6 and shared["runs_asked"] == \
        shared["runs_unique"] + 4  # two pre-trainings of two phases each, counted once
    stores = (str(first.sweeps[f"pretrain/{name}"].folder) for name in ("none", "ltr_no_nsp"))
    reused = [r["gpu_hours"] for store in stores for r in plan["runs"] if r["folder"].startswith(store)]
    assert len(reused) == 4 and shared["gpu_hours_saved"] == pytest.approx(sum(reused))
    run_table(second, dry_run=True)  # nothing trained yet: Figure 4 would pre-train
    assert any("task=pretrain" in line for line in capsys.readouterr().out.splitlines())
    with composing_jobs():  # Table 5's pre-training, finished: a result of the science each job composes
        for sweep in first.sweeps.values():
            if sweep.stage == "pretrain":
                swept, folder = sweep.jobs()[0]
                write_results(folder, "pretrain", {"val/mlm_loss": 5.0},
                              config=job_config(sweep, swept, folder.parents[1]))
    run_table(second, dry_run=True)
    launched = capsys.readouterr().out.splitlines()
    assert launched and not any("task=pretrain" in line for line in launched)


@pytest.mark.slow
def test_each_data_cache_is_charged_once_to_the_first_run_that_builds_it(tmp_path, monkeypatch):
    """The corpus is read and tokenized once for every pre-training with its vocabulary (phase 2 reads phase
    1's from its checkpoint); each round of instances is built once for every run with its data settings:
    Table 5's three rows (NSP, No NSP, LTR) build their own, at each phase's length; Table 6's model sizes
    share theirs."""
    one = ["grid.optim.epochs=3", "grid.data.batch_size=32"]  # fewer compositions; the runs are the same
    table5 = build("table5", "paper", tmp_path, sets=one)
    rates, rounds = planning.cpu_rates(), 10  # scale=paper's dupe_factor
    corpus = table5.spec["corpus_tokens"]["hub"]
    tokenize, one_round = (corpus / rates[f"{kind}_tokens_per_s"] / 3600 for kind in ("text", "round"))
    plan5 = make_plan(table5)
    pretrain = [r for r in plan5["runs"] if r["kind"] == "pretrain"]
    assert [r["phase"] for r in pretrain] == [1, 2] * 3
    assert [r["prep_hours"] for r in pretrain] == pytest.approx([tokenize + rounds * one_round]
                                                                + [rounds * one_round] * 5)
    assert all(r["prep_hours"] == 0 for r in plan5["runs"] if r["kind"] == "finetune")
    assert plan5["total_prep_hours"] == pytest.approx(tokenize + 6 * rounds * one_round)
    # the data caches' disk: the plan's less the same plan's with no data on disk (checkpoints only)
    none = {**rates, "text_cache_bytes_per_token": 0, "instance_bytes_per_token": {"128": 0, "512": 0}}
    monkeypatch.setattr(planning, "cpu_rates", lambda: none)
    checkpoints = make_plan(table5)["runs"]
    data_gb = [r["disk_gb"] - c["disk_gb"] for r, c in zip(plan5["runs"], checkpoints)
               if r["kind"] == "pretrain"]
    monkeypatch.undo()
    text_gb = corpus * rates["text_cache_bytes_per_token"] / 1e9
    per_token = rates["instance_bytes_per_token"]
    instances_gb = {seq: rounds * corpus * per_token[str(seq)] / 1e9 for seq in (128, 512)}
    assert data_gb == pytest.approx([text_gb + instances_gb[128]] + [instances_gb[512], instances_gb[128]] * 2
                                    + [instances_gb[512]])
    table6 = make_plan(build("table6", "paper", tmp_path, sets=one))
    pretrain = [r for r in table6["runs"] if r["kind"] == "pretrain"]
    assert len(pretrain) == 12 and [r["prep_hours"] for r in pretrain] == pytest.approx(
        [tokenize + rounds * one_round, rounds * one_round] + [0] * 10)  # five more sizes read the first's


@pytest.mark.slow
def test_fine_tuning_is_planned_at_the_measured_padded_length_not_the_maximum(tmp_path, planned):
    """Table 5's SST-2 (sentences of ~10 tokens; v2 A.3's grid of batches 16 and 32) costs a fraction of its
    128-token maximum; the released code's fixed padding (speed.padding=max_length) pays the whole length."""
    table, plan = planned("table5", "budget")  # Table 5 starts from no external checkpoint
    lengths = table.spec["token_lengths"]
    sst2 = [r for r in plan["runs"] if "/sst2/" in r["name"]]
    assert {re.search(r"data.batch_size-(\d+)", r["name"]).group(1) for r in sst2} == {"16", "32"}
    for run in sst2:
        batch = int(re.search(r"data.batch_size-(\d+)", run["name"]).group(1))
        padded = run["tokens"] / (run["steps"] * batch)
        expected = PadCollator().mean_padded_length(lengths["sst2"], batch, 128)
        assert padded == pytest.approx(expected, rel=0.01)
        assert 15 < padded < 64  # the batch's longest of sentences whose median is 11 tokens
    fixed_padding = ["finetune_overrides.speed.padding=max_length"]
    fixed = make_plan(build("table5", "budget", tmp_path, sets=fixed_padding))
    tokens = {r["name"]: r["tokens"] for r in fixed["runs"]}
    for run in sst2:
        batch = int(re.search(r"data.batch_size-(\d+)", run["name"]).group(1))
        assert tokens[run["name"]] == run["steps"] * batch * 128


@pytest.mark.parametrize("task", ["mrpc"])  # a pair task: text_b, truncation, [SEP]s
@pytest.mark.slow
def test_the_length_quantiles_in_table_tasks_are_what_the_tasks_data_path_measures(task, shared_data,
                                                                                   minilm_dir):
    """The stored quantiles are a measurement, not a guess: measured again through the task's DataModule and
    collator (`python -m bert_repro.benchmarks.lengths TASK` prints table_tasks.yaml's line)."""
    stored = load_spec("table1", "smoke")["token_lengths"][task]
    assert measure_lengths(task) == stored


@pytest.mark.slow
def test_a_rehearsal_states_its_planned_wall_time_before_it_runs(tmp_path, monkeypatch, capsys):
    """The plan's cost model on this CPU: each job's FLOPs at the measured rate, and the start-up (a process a
    sweep) and set-up (a job) an earlier rehearsal measured; printed before the first run starts."""
    from bert_repro.benchmarks import train_step
    from bert_repro.tables import rehearse as rehearsal

    earlier = tmp_path / "rehearsal" / "table5" / "paper"
    earlier.mkdir(parents=True)
    fixed = {"finetune: squad_v1": {"sweep": "finetune/x/squad_v1", "startup_s": 30.0, "setup_s": 5.0}}
    (earlier / "rehearsal.json").write_text(json.dumps({"calibration": {"fixed": fixed}}))
    monkeypatch.setattr(train_step, "cpu_speed", lambda conf_dir: {"flops_per_s": 1e9})
    priced, compute_seconds = [], rehearsal.compute_seconds
    monkeypatch.setattr(rehearsal, "compute_seconds",
                        lambda small, rate: priced.append(compute_seconds(small, rate)) or priced[-1])

    def run_table(small, launcher, force):  # the statement is out before the runner starts
        raise KeyboardInterrupt(capsys.readouterr().out)

    monkeypatch.setattr(rehearsal, "run_table", run_table)
    with pytest.raises(KeyboardInterrupt) as stopped:
        rehearsal.rehearse(build("table2", "budget", tmp_path, {"*": "/ckpt/given"}), tmp_path, tmp_path)
    compute = priced[0]
    assert len(compute) == 2 and all(s > 0 for s in compute.values())  # 2 rows x the grid's first seed
    planned = sum(compute.values()) + 2 * 30 + 2 * 5  # two sweeps of one job each
    said = str(stopped.value)
    assert f"2 of 6 planned runs (first grid), steps / 1; planned {planned:.0f} s on this CPU" in said
    assert "at 1.0 GFLOP/s, start-up and set-up as last measured" in said


@pytest.mark.slow
def test_the_plan_prices_at_the_mfu_that_gpu_check_measured(tmp_path, monkeypatch):
    """A train-step row of benchmarks/gpu_check.py's report (BERT-base at 384 tokens, MFU 60%) replaces the
    assumed 30% of Table 2's runs of that width and length, halving their compute; BERT-large's stay."""
    import sys

    from bert_repro.benchmarks import gpu_check
    from bert_repro.benchmarks.gpu_check import Step, check

    table = build("table2", "budget", tmp_path, inits={"*": "/ckpt/given"})
    assumed = make_plan(table)
    row = json.dumps({"model": "base", "seq": 384, "device": "cuda", "ours_mfu": 0.6})
    bench = Step("bench", 60, lambda folder, done: [sys.executable, "-c", f"print({row!r})"])
    report = check(tmp_path / "gpu", 60, [bench], "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(gpu_check, "OUT_DIR", report.parent)
    measured = make_plan(table)
    assert measured["mfu"]["H768/T384"] == (0.6, f"bench ({report.name})")
    assert measured["mfu"]["H1024/T384"] == assumed["mfu"]["H1024/T384"]
    ratios = sorted(m["compute_hours"] / a["compute_hours"]
                    for m, a in zip(measured["runs"], assumed["runs"]))
    assert ratios == pytest.approx([0.5] * 3 + [1.0] * 3)


def test_the_cpu_plan_is_calibrated_on_each_kinds_second_sweep_and_checked_on_the_others(tmp_path):
    """Each job computes 2 s, spends 3 s more (set-up) and its sweep's process 10 s before and after them
    (start-up): measured on a kind's second sweep, those price the other sweeps exactly."""
    from bert_repro.tables.rehearse import calibrate

    table = build("table2", "budget", tmp_path, {"*": "/ckpt/given"})
    summary, compute = [], {}
    for sweep in table.sweeps.values():
        for _, folder in sweep.jobs():
            write_results(folder, "squad_v1", {"val/f1": 80.0})
            results = json.loads((folder / "results.json").read_text())
            (folder / "results.json").write_text(json.dumps({**results, "wall_time_s": 5.0}))
            compute[f"{sweep.name}/{folder.name}"] = 2.0
        summary.append({"sweep": sweep.name, "skipped": 0, "complete": len(sweep.jobs()), "failed": 0,
                        "wall_s": 10.0 + 5.0 * len(sweep.jobs())})
    calibration = calibrate(table, summary, compute)
    kinds = {sweep.overrides["task"] for sweep in table.sweeps.values()}
    assert {k: (f["startup_s"], f["setup_s"]) for k, f in calibration["fixed"].items()} == {
        f"finetune: {task}": (10.0, 3.0) for task in kinds}
    jobs = sum(len(s.jobs()) for s in table.sweeps.values())
    assert calibration["total"] == {"runs": jobs, "planned_s": 5.0 * jobs + 10.0 * len(table.sweeps),
                                    "measured_s": 5.0 * jobs + 10.0 * len(table.sweeps), "ratio": 1.0}
    assert 0 < calibration["held_out"]["runs"] < jobs and calibration["held_out"]["ratio"] == 1.0
