"""`make gpu-check` (benchmarks/gpu_check.py) on a machine without a GPU: it refuses at once with a message;
its orchestration (steps mocked as tiny child processes) records a failing, a hanging and a crashing step
and still runs the others, writing the JSON and Markdown after every step."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bert_repro.benchmarks import gpu_check
from bert_repro.benchmarks.gpu_check import Step, check


def test_without_cuda_it_exits_at_once_with_a_message(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_check.main(["--out", str(tmp_path)]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())  # nothing written


def _python(code: str):
    return lambda folder, done: [sys.executable, "-c", code]


def _unreadable(stdout, folder, done):
    raise KeyError("val/acc")


@pytest.mark.slow
def test_a_failing_step_is_recorded_and_the_others_still_run(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(gpu_check, "SHORTEST_STEP_S", 1)  # the hanging step's limit in seconds, not minutes
    plan = [
        Step(
            "first",
            30,
            _python(
                'print(\'{"model": "base", "seq": 128, "ratio": 1.6, "ours_tokens_per_s": 9e4, '
                '"ours_mfu": 0.5}\')'
            ),
        ),
        Step("fails", 30, _python("import sys; print('boom', file=sys.stderr); sys.exit(3)")),
        Step("hangs", 2, _python("import time; time.sleep(60)")),
        Step("reader", 30, _python("print('done')"), _unreadable),
        Step(
            "last",
            30,
            _python('print(\'{"largest_batch": 96, "model": "large", "seq": 512, "checkpointing": true}\')'),
        ),
    ]
    path = check(tmp_path / "gpu", budget_s=120, plan=plan, device="NVIDIA H200")
    assert path == tmp_path / "gpu" / f"nvidia-h200-{json.loads(path.read_text())['date']}.json"
    report = json.loads(path.read_text())
    status = {s["name"]: s["status"] for s in report["steps"]}
    assert status == {"first": "ok", "fails": "failed", "hangs": "timeout", "reader": "failed", "last": "ok"}
    steps = {s["name"]: s for s in report["steps"]}
    assert steps["fails"]["returncode"] == 3 and "boom" in steps["fails"]["error"]
    assert "KeyError" in steps["reader"]["error"]
    assert steps["first"]["results"]["lines"][0]["ratio"] == 1.6
    summary = path.with_suffix(".md").read_text()
    assert "base/128: 90000 tok/s, MFU 0.50, 1.60x" in summary and "large/512 ckpt=True: 96" in summary
    assert "hangs: timeout" in capsys.readouterr().out


@pytest.mark.slow
def test_the_budget_caps_every_step(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_check, "SHORTEST_STEP_S", 1)
    plan = [Step("slow", 60, _python("import time; time.sleep(60)")), Step("next", 60, _python("print(1)"))]
    report = json.loads(check(tmp_path, budget_s=2, plan=plan, device="gpu").read_text())
    assert [s["status"] for s in report["steps"]] == ["timeout", "skipped"]
    assert report["steps"][0]["limit_s"] == 2


@pytest.mark.slow
def test_the_command_itself_refuses_without_cuda(tmp_path):
    """The real entry point, as `make gpu-check` runs it, where no GPU is visible: status 2, the message,
    no traceback, nothing measured or written."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # no GPU, even on a GPU node
    proc = subprocess.run([sys.executable, "-m", "bert_repro.benchmarks.gpu_check", "--out", str(tmp_path)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 2
    assert "needs a CUDA GPU" in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stdout == "" and not list(tmp_path.iterdir())


def _fake_training(final: dict):
    """subprocess.run for the reference's training run: a results.json with ``final`` in its folder."""
    def run(command, **kwargs):
        folder = Path(next(a for a in command if a.startswith("hydra.run.dir=")).split("=", 1)[1])
        assert "trainer=cpu" in command and "trainer=gpu" not in command
        folder.mkdir(parents=True, exist_ok=True)
        results = {"status": "complete", "wall_time_s": 5.0, "metrics": {"final": final}}
        (folder / "results.json").write_text(json.dumps(results))
        return subprocess.CompletedProcess(command, 0)

    return run


def test_the_cpu_reference_says_how_it_was_made_and_the_mrpc_step_reads_it(monkeypatch, tmp_path):
    """--cpu-reference-run (the training run mocked) writes the accuracy with its command, CPU, torch and
    date; the MRPC step compares against that file, by default the committed one."""
    final = {"val/acc": 0.8, "val/f1": 0.86, "val/top_class_share": 0.6}
    monkeypatch.setattr(gpu_check.subprocess, "run", _fake_training(final))
    out = tmp_path / "gpu" / "mrpc_cpu_reference.json"
    assert gpu_check.main(["--cpu-reference-run", "--cpu-reference", str(out)]) == 0
    reference = json.loads(out.read_text())
    assert reference["acc"] == 0.8 and reference["precision"] == "fp32"
    assert reference["torch"] == torch.__version__ and reference["device"] == "cpu"
    assert reference["cpu_model"] and reference["date"] and "task=mrpc" in reference["train_command"]
    assert gpu_check.compare_mrpc({"final": {"val/acc": 0.805}}, out)["within_1_point"]
    assert not gpu_check.compare_mrpc({"final": {"val/acc": 0.78}}, out)["within_1_point"]
    committed = Path(__file__).parent.parent / gpu_check.CPU_REFERENCE  # what `make gpu-check` reads
    assert committed.is_file(), f"{committed}: run --cpu-reference-run and commit it"
    assert {"acc", "command", "cpu_model", "torch", "date"} <= json.loads(committed.read_text()).keys()


def test_a_cpu_reference_stuck_on_one_class_is_refused(monkeypatch, tmp_path):
    """A reference that predicts the majority class everywhere (MRPC: 68.4 %) would pass any bf16 run that
    is stuck too: refused with a message, nothing written."""
    final = {"val/acc": 0.6838, "val/f1": 0.81, "val/top_class_share": 1.0}
    monkeypatch.setattr(gpu_check.subprocess, "run", _fake_training(final))
    out = tmp_path / "mrpc_cpu_reference.json"
    with pytest.raises(SystemExit, match="predicts one class for every Dev example"):
        gpu_check.main(["--cpu-reference-run", "--cpu-reference", str(out)])
    assert not out.exists()


def _plan():
    return gpu_check.steps(Path("../shared/data"), gpu_check.CPU_REFERENCE)


def test_the_plan_warms_the_compiler_first_and_fits_eight_minutes():
    """Every step has its own limit; all but the optional MRPC tail fit the default budget together, and the
    compile cache is warmed before any compiled bench."""
    plan = _plan()
    names = [s.name for s in plan]
    assert names[0] == "warm-compile-cache" and names[-1] == "mrpc-bf16"
    assert sum(s.limit_s for s in plan[:-1]) <= gpu_check.BUDGET_S <= 8 * 60
    wanted = {"bench-base-128-b128", "bench-base-128-b512", "bench-base-128-b1024", "bench-large-512",
              "bench-lengths-pretrain", "bench-lengths-mrpc", "bench-compiled-padded",
              "bench-compiled-unpadded", "pretrain-budget-batch", "profile-fastest", "cuda-tests"}
    assert wanted <= set(names)


def test_every_bench_command_is_one_train_step_takes():
    """The GPU machine runs these argument lists unattended: each parses with train_step's own parser, with
    the batch the step is named after (tokens // seq)."""
    from bert_repro.benchmarks.train_step import arguments

    for step in _plan():
        if step.name == "profile-fastest":  # built from the rows measured before it (test below)
            continue
        argv = step.command(Path("/tmp/x"), [])
        if argv[1:3] != ["-m", "bert_repro.benchmarks.train_step"]:
            continue
        args = arguments().parse_args(argv[3:])
        assert args.device == "cuda" and args.precision == "bf16", step.name
        if step.name.startswith("bench-base-128-b"):
            assert args.tokens // args.seq[0] == int(step.name.rsplit("b", 1)[1]), step.name
    lengths = next(s for s in _plan() if s.name == "bench-lengths-pretrain").command(Path("/tmp/x"), [])
    assert arguments().parse_args(lengths[3:]).tokens // 128 == 256  # the budget's batch, as the run's


def test_the_budget_batch_run_composes_as_budget_scale_batch_and_length():
    """src/train.py's overrides of the pre-training run compose (a wrong key would fail on the GPU machine)
    into budget scale's batch of 256 at 128 tokens."""
    from hydra import compose, initialize_config_dir

    from .conftest import CONF

    argv = next(s for s in _plan() if s.name == "pretrain-budget-batch").command(Path("/tmp/run"), [])
    overrides = [a for a in argv[2:] if not a.startswith(("hydra.", "ckpt_path"))]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=overrides)
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        budget = compose("train", overrides=["task=pretrain", "scale=budget"])
    compose_budget = budget.scale.pretrain
    assert cfg.scale.pretrain.batch_size == compose_budget.batch_size == 256
    assert cfg.scale.pretrain.max_seq_length == compose_budget.max_seq_length == 128
    assert cfg.trainer.precision == "bf16-mixed"


def _bench_row(**row):
    return {"model": "base", "seq": 128, "batch": 256, "real_tokens": 16384, "ours_tokens_per_s": 4e5,
            "ratio": 1.5, "ours_mfu": 0.3, **row}


def test_the_fastest_row_is_profiled_with_its_own_shape():
    done = [{"name": "bench-eager", "command": "py -m bert_repro.benchmarks.train_step --model base --model "
             "large --seq 128 --seq 512 --compare-unpad --tokens 16384",
             "results": {"lines": [_bench_row(),
                                   _bench_row(model="large", seq=512, unpad=True, ours_mfu=0.4)]}},
            {"name": "pretrain", "results": {"tokens_per_s": 1.0}}]
    argv = gpu_check.profile_fastest(done)
    assert argv[:3] == ["py", "-m", "bert_repro.benchmarks.train_step"]
    assert argv.count("--model") == argv.count("--seq") == 1 and "--compare-unpad" not in argv
    assert argv[argv.index("--model") + 1] == "large" and argv[argv.index("--seq") + 1] == "512"
    assert "--unpad" in argv and argv[argv.index("--profile") + 1] == "3"
    with pytest.raises(RuntimeError, match="nothing to profile"):
        gpu_check.profile_fastest(done[1:])


def test_the_run_is_read_against_the_bench_at_its_batch(tmp_path):
    """The run's real tokens/s over the bench's padded row's real tokens/s (its rate times the real share)."""
    (tmp_path / "results.json").write_text(json.dumps({"status": "complete", "tokens_per_s": 1.5e5,
                                                       "perf": {"mfu": 0.4, "step_share": 0.8},
                                                       "metrics": {"final": {}}}))
    (tmp_path / "metrics.csv").write_text("train/loss\n9.0\n8.0\n7.0\n")
    done = [{"name": "bench-lengths-pretrain",
             "results": {"lines": [_bench_row(), _bench_row(unpad=True, ours_tokens_per_s=9e5)]}}]
    out = gpu_check.read_run_against_bench("bench-lengths-pretrain")("", tmp_path, done)
    assert out["bench_real_tokens_per_s"] == 2e5  # 4e5 x 16384 / (256 x 128)
    assert out["run_over_bench"] == 0.75 and out["loss_falls"]
    report = {"device": "d", "date": "x", "torch": "t", "cuda": "c", "budget_s": 1, "elapsed_s": 1,
              "steps": [{"name": "run", "status": "ok", "results": out}]}
    summary = gpu_check.summary_markdown(report)
    assert "run_over_bench 0.75" in summary and "step share 0.8" in summary  # of its wall time
