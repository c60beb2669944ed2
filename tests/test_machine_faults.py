"""Faults of the machine, named: a full disk at a checkpoint's save or at results.json, a read-only cache
folder, a missing permission. Each ends the run with a message that says what it is and where, a non-zero exit
and no traceback; the last good checkpoint and the earlier results.json stay as they were, and no temporary
file is left beside them.

A full disk is the kernel's own: the run's temporary files are created as usual, but their writes go to
/dev/full (ENOSPC). A read-only folder is a read-only bind mount in a user namespace (root ignores chmod)."""

import errno
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from bert_repro.lifecycle.exits import MachineFault, machine_faults_named
from bert_repro.lifecycle.reliability import AtomicCheckpointIO

from .conftest import FAST, REPO, fingerprint, run_py

needs_dev_full = pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (Linux)")


def on_a_full_disk(folder: Path, monkeypatch) -> None:
    """Temporary files made under ``folder`` (checkpoints', results.json's) on a full disk: created, but their
    writes fail as the kernel fails them."""
    mkstemp = tempfile.mkstemp

    def full_mkstemp(*args, dir=None, **kwargs):
        fd, name = mkstemp(*args, dir=dir, **kwargs)
        if dir is not None and Path(dir).resolve().is_relative_to(folder.resolve()):
            full = os.open("/dev/full", os.O_WRONLY)
            os.dup2(full, fd)
            os.close(full)
        return fd, name

    monkeypatch.setattr(tempfile, "mkstemp", full_mkstemp)


def full_disk_run(folder: Path, monkeypatch, *args: str) -> tuple[int, str]:
    """src/train.py ``args`` with ``folder`` on a full disk, run in this process (conftest.in_process)."""
    on_a_full_disk(folder, monkeypatch)
    proc = run_py(*args)
    return proc.returncode, proc.stdout + proc.stderr


def temporary_files(folder: Path) -> list[Path]:
    return [p for p in folder.rglob(".*") if p.is_file() and p.name not in (".lock",)
            and ".hydra" not in p.parts]


@needs_dev_full
def test_a_full_disk_at_a_checkpoints_save_is_named_and_the_old_one_kept(tmp_path, monkeypatch):
    path = tmp_path / "checkpoints" / "last.ckpt"
    io = AtomicCheckpointIO()
    io.save_checkpoint({"step": torch.tensor(1)}, path)
    before = path.read_bytes()
    on_a_full_disk(tmp_path, monkeypatch)
    with pytest.raises(OSError) as err:  # torch.save says RuntimeError: [enforce fail at inline_container.cc]
        io.save_checkpoint({"step": torch.tensor(2), "weights": torch.zeros(100_000)}, path)
    assert (err.value.errno, err.value.filename) == (errno.ENOSPC, str(path))
    assert path.read_bytes() == before
    assert list(path.parent.iterdir()) == [path]  # its temporary file removed


@pytest.mark.parametrize("fault, file, message", [
    (errno.EROFS, "cache/glue/rows.arrow", "read-only file system writing CACHE/glue/rows.arrow: make it "
     "writable and rerun, or choose another folder with paths.cache_dir=... (now CACHE)"),
    (errno.EACCES, "run/results.json", "permission denied on RUN/results.json: give this user access and "
     "rerun, or choose another folder with hydra.run.dir=... (now RUN)"),
    (errno.ENOSPC, None, "no space left on device writing CACHE: free space and rerun, or choose another "
     "folder with paths.cache_dir=..."),  # a write names no file: the place that is full
])
def test_machine_faults_say_what_they_are_and_where(tmp_path, monkeypatch, fault, file, message):
    run, cache = tmp_path / "run", tmp_path / "cache"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "last.ckpt").write_bytes(b"good")
    cache.mkdir()
    usage = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(p)._replace(free=0 if p == cache else 1 << 40))
    with pytest.raises(MachineFault) as err:
        with machine_faults_named({"hydra.run.dir": run, "paths.cache_dir": cache},
                                  run / "checkpoints" / "last.ckpt"):
            raise OSError(fault, os.strerror(fault), *([str(tmp_path / file)] if file else []))
    kept = f"; the last good checkpoint {run}/checkpoints/last.ckpt is kept"
    assert str(err.value) == message.replace("CACHE", str(cache)).replace("RUN", str(run)) + kept


@pytest.mark.e2e
@needs_dev_full
def test_a_full_disk_during_a_run_is_named_and_the_earlier_run_kept(good, monkeypatch):
    _, out, cache, _ = good
    before = fingerprint(out)
    last = out / "checkpoints" / "last.ckpt"
    # +force=true: the good run is finished (finished.py), so only a forced rerun writes anything
    command = [*FAST, f"paths.cache_dir={cache}", f"hydra.run.dir={out}", "+force=true"]
    # resuming its last.ckpt: at its last step, it validates, then writes results.json; and a new start
    # (force's default), which first writes a checkpoint
    for args, written in (([*command, f"ckpt_path={last}"], f"writing {out}/results.json: "),
                          (command, f"writing {out}/checkpoints/")):
        code, output = full_disk_run(out, monkeypatch, *args)
        assert code == 74, output[-3000:]
        assert (f"no space left on device {written}" in output
                and "free space and rerun, or choose another folder with hydra.run.dir=..." in output
                and f"the last good checkpoint {last} is kept" in output), output[-3000:]
        assert "Traceback" not in output
        assert fingerprint(out) == before
        assert temporary_files(out) == []


def read_only_run(folder: Path, *args: str) -> subprocess.CompletedProcess:
    """src/train.py ``args`` with ``folder`` read-only: bind-mounted so in a user namespace of its own."""
    mount = 'mount --bind -o ro "$0" "$0" && exec "$@"'
    return subprocess.run(["unshare", "-rm", "sh", "-c", mount, str(folder), sys.executable,
                           str(REPO / "src" / "train.py"), *args], cwd=REPO, capture_output=True, text=True,
                          timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})


def can_mount_read_only() -> bool:
    with tempfile.TemporaryDirectory() as folder:
        command = ["unshare", "-rm", "sh", "-c", 'mount --bind -o ro "$0" "$0" && ! touch "$0/x"', folder]
        return shutil.which("unshare") is not None and subprocess.run(command).returncode == 0


@pytest.mark.e2e
@pytest.mark.skipif(not can_mount_read_only(), reason="needs unshare with user and mount namespaces")
def test_a_read_only_cache_folder_is_named(good, tmp_path):
    _, out, _, _ = good
    before = fingerprint(out)
    cache = tmp_path / "read_only_cache"
    cache.mkdir()
    proc = read_only_run(cache, *FAST, f"paths.cache_dir={cache}", f"hydra.run.dir={out}", "+force=true")
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, output[-3000:]
    assert (f"cache folder {cache} is not writable (Read-only file system); choose another with "
            "paths.cache_dir=..." in output), output[-3000:]
    assert "Traceback" not in output
    assert fingerprint(out) == before
