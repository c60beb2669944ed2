"""Pieces several test files share: runs in processes of their own started warm, fine-tuning modules
validated on one process and on two DDP ranks, pre-training steps taken by hand, and a table rehearsed on
this CPU."""

import csv
import importlib
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from bert_repro.tables import __main__ as cli
from bert_repro.tables import warm

from .conftest import REPO


def started(cmd: list[str], log: Path, cwd: Path = REPO,
            env: dict[str, str] | None = None) -> warm.WarmProcess | subprocess.Popen:
    """``cmd`` (``[sys.executable, script.py | -m module, *args]``) in a process of its own, where the process
    is the point (signals, DDP ranks), its output in the file ``log``: forked from the forkserver that has
    imported torch and Lightning (tables/warm.py, as the table runner starts runs: those imports once per
    test worker, not once per process), or a cold process where it cannot be (see warm.start). ``env``:
    this process's environment by default."""
    env = {**(os.environ if env is None else env), "OMP_NUM_THREADS": "1"}  # small models, in_process's sums
    if (proc := warm.start(cmd, cwd=cwd, env=env, stdout=log)) is not None:
        return proc
    with log.open("w") as out:  # a cold process imports this repository's tests (callbacks) too
        return subprocess.Popen(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                env={**env, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "src")])})


def ended(proc: warm.WarmProcess | subprocess.Popen, log: Path, timeout: float = 600) -> tuple[int, str]:
    """``proc``'s exit status and output (``log``) once it ended; killed if it runs past ``timeout``."""
    try:
        return proc.wait(timeout), log.read_text()
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()


# a tiny encoder over the real 30522-token vocabulary; large random weights make its predictions vary
VARIED = dict(vocab_size=30522, hidden_size=32, num_layers=2, num_heads=2, initializer_range=1.0)


def call_in_new_process(function: str, *args: str) -> None:
    """Calls ``function`` ("tests.test_x.name") with ``args`` in a process of its own (``started``: `python
    -m tests.helpers`), the parent of its DDP ranks; fails the test with the output's tail when it fails."""
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp, "output.log")
        code, output = ended(started([sys.executable, "-m", "tests.helpers", function, *args], log), log)
    assert code == 0, output[-3000:]


def validate_on_one_and_two_ranks(make_module: Callable[[], Any], make_data: Callable[[], Any],
                                  root: str) -> list[tuple[dict[str, float], Any, Path]]:
    """Validates one set of weights (``make_module``'s, seed 0) on 1 process and on 2 DDP ranks (CPU, gloo):
    (dev metrics, the datamodule, the trainer's root folder ``root``.<devices>) of each."""
    import lightning as L

    torch.manual_seed(0)
    state = make_module().state_dict()
    runs = []
    for devices, strategy in ((1, "auto"), (2, "ddp_fork")):
        data = make_data()
        module = make_module()
        module.load_state_dict(state)
        folder = Path(f"{root}.{devices}")
        trainer = L.Trainer(accelerator="cpu", devices=devices, strategy=strategy, logger=False,
                            default_root_dir=folder, enable_progress_bar=False, enable_model_summary=False)
        runs.append((trainer.validate(module, datamodule=data, verbose=False)[0], data, folder))
    return runs


def pretrain_losses(module: Any, batches: Iterable[dict[str, torch.Tensor]], lr: float) -> list[float]:
    """The training loss of each of ``batches``, an AdamW step of ``module`` (a PretrainModule) after each."""
    optimizer = torch.optim.AdamW(module.parameters(), lr=lr)
    losses = []
    for batch in batches:
        loss = module._step(batch, "train")
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def rehearse(name: str, scale: str, tmp_path: Path, monkeypatch, *flags: str):
    """`python -m bert_repro.tables rehearse` on this CPU; checks every cell is filled or marked with a reason
    and returns the rehearsal's folder, its cells and its record."""
    monkeypatch.setenv("BERT_REPRO_CACHE", str(tmp_path / "cache"))
    for key, value in {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}.items():
        monkeypatch.setenv(key, value)
    runs, results = tmp_path / "runs", tmp_path / "results"
    args = ["--scale", scale, "--runs-dir", str(runs), "--results-dir", str(results), *flags]
    assert cli.main(["rehearse", name, *args]) == 0
    record = json.loads((runs / "rehearsal" / name / scale / "rehearsal.json").read_text())
    assert record["step_problems"] == [] and all(s["failed"] == 0 for s in record["sweeps"]), record
    with (results / "rehearsal" / f"{name}.csv").open() as f:
        cells = list(csv.DictReader(f))
    for cell in cells:  # every cell a number, or a mark with its reason
        assert (cell["status"] == "ok" and cell["ours"]) or (cell["ours"] == "" and cell["reason"]), cell
    return runs / "rehearsal" / name / scale, cells, record


def assert_plan_holds(record: dict, folder: Path) -> None:
    """The CPU plan (tables/rehearse.py) within 1.25x of the measured wall time of the runs it did not
    calibrate on, each rehearsed run's planned and measured seconds in rehearsal.json."""
    calibration = record["calibration"]
    held_out = calibration["held_out"]
    assert held_out["runs"] > 0 and all(r["measured_s"] > 0 for r in calibration["runs"]), calibration
    assert 0.8 <= held_out["ratio"] <= 1.25, (held_out, calibration["fixed"], calibration["cpu"])
    assert len(calibration["runs"]) == record["rehearsed_jobs"], calibration  # every job: each sweep ran
    assert all(r["planned_s"] > 0 for r in calibration["runs"]), calibration


@contextmanager
def held_by_another_process(folder: Path) -> Iterator[int]:
    """``folder`` locked by a live process (its pid) for the duration."""
    code = ("import sys; from bert_repro.lifecycle.locks import RunFolderLock; "
            "RunFolderLock(sys.argv[1]).__enter__(); print('held', flush=True); sys.stdin.read()")
    holder = subprocess.Popen([sys.executable, "-c", code, str(folder)], cwd=REPO, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        yield holder.pid
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)


class ScalarReads(TorchDispatchMode):
    """The ops, while active, that read a scalar off the device (``.item()``, ``int()``, ``bool()``) or
    whose output size is the data's (``nonzero``: a boolean index): each a host sync on a GPU."""

    def __init__(self):
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        boolean_index = func is torch.ops.aten.index.Tensor and any(
            index is not None and index.dtype == torch.bool for index in args[1])
        reads = (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.is_nonzero.default,
                 torch.ops.aten.nonzero.default, torch.ops.aten.masked_select.default)
        if boolean_index or func in reads:
            self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


if __name__ == "__main__":  # call_in_new_process's child: tests.helpers FUNCTION ARGS...
    module, name = sys.argv[1].rsplit(".", 1)
    getattr(importlib.import_module(module), name)(*sys.argv[2:])
