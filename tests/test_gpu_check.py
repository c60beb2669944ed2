"""`make gpu-check` (benchmarks/gpu_check.py) on a machine without a GPU: it refuses at once with a message;
its orchestration (steps mocked as tiny child processes) records a failing, a hanging and a crashing step
and still runs the others, writing the JSON and Markdown after every step."""

import json
import sys

import torch

from bert_repro.benchmarks import gpu_check
from bert_repro.benchmarks.gpu_check import Step, check


def test_without_cuda_it_exits_at_once_with_a_message(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_check.main(["--out", str(tmp_path)]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())  # nothing written


def _python(code: str):
    return lambda folder: [sys.executable, "-c", code]


def _unreadable(stdout, folder):
    raise KeyError("val/acc")


def test_a_failing_step_is_recorded_and_the_others_still_run(tmp_path, capsys):
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
        Step("hangs", 6, _python("import time; time.sleep(60)")),
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


def test_the_budget_caps_every_step(tmp_path):
    plan = [Step("slow", 60, _python("import time; time.sleep(60)")), Step("next", 60, _python("print(1)"))]
    report = json.loads(check(tmp_path, budget_s=6, plan=plan, device="gpu").read_text())
    assert [s["status"] for s in report["steps"]] == ["timeout", "skipped"]
    assert report["steps"][0]["limit_s"] == 6
