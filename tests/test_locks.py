"""One process per run folder (bert_repro.lifecycle.locks): src/train.py or src/evaluate.py started into a
live run's folder is refused at once, naming the holder, and leaves the folder as it was; so is a multirun
job, which fails alone; a run takes its folder's lock once and holds it to its end; a lock whose holder was
killed is taken over with one log line; the DDP ranks a run starts work under their launcher's lock."""

import json
import logging
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, OmegaConf

from bert_repro.lifecycle.exits import run_ends
from bert_repro.lifecycle.folder import RunFolder
from bert_repro.lifecycle.hydra_hooks import OutputFolderCheck
from bert_repro.lifecycle.locks import FolderInUse, RunFolderLock

from .conftest import CONF, FAST, REPO, fingerprint, run_py
from .helpers import held_by_another_process


def earlier_run(folder: Path) -> Path:
    """A run folder with results and a checkpoint; refused processes must not read or touch them."""
    (folder / "checkpoints").mkdir(parents=True)
    (folder / "results.json").write_text('{"status": "complete"}\n')
    (folder / "checkpoints" / "last.ckpt").write_bytes(os.urandom(1024))
    return folder


@pytest.mark.e2e
def test_a_second_process_into_a_live_run_folder_is_refused(tmp_path):
    folder = earlier_run(tmp_path / "run")
    before = fingerprint(folder)
    commands = {"train.py": FAST, "evaluate.py": ["task=rte", f"init={folder}/checkpoints/last.ckpt"]}
    with held_by_another_process(folder) as pid:
        for script, args in commands.items():
            command = [sys.executable, str(REPO / "src" / script), *args, f"hydra.run.dir={folder}",
                       f"paths.cache_dir={tmp_path / 'cache'}"]
            proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300,
                                  env={**os.environ, "OMP_NUM_THREADS": "1"})
            output = proc.stdout + proc.stderr
            assert proc.returncode == 2, output[-3000:]
            assert f"run folder {folder} is in use by pid {pid} on host {socket.gethostname()}" in output
            assert "Traceback" not in output
    assert fingerprint(folder) == before
    assert not (folder / ".hydra").exists()  # refused before Hydra wrote this command's config into it


@pytest.mark.slow
def test_a_multirun_job_into_a_live_run_folder_fails_alone(tmp_path, caplog):
    from bert_repro.lifecycle.run import main

    folder = earlier_run(tmp_path / "run")
    before = fingerprint(folder)
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=[*FAST, f"paths.output_dir={folder}", f"paths.cache_dir={tmp_path}"])
    hook = OutputFolderCheck()
    with held_by_another_process(folder) as pid:
        # Hydra calls on_job_start outside its error handling: a refusal there must not raise
        hook.on_job_start(config=job_config(folder), task_function=main)
        with pytest.raises(SystemExit) as exit_:
            main(cfg)
        hook.on_job_end(config=job_config(folder), job_return=None)
    assert exit_.value.code == 2
    assert f"run folder {folder} is in use by pid {pid}" in caplog.text
    assert fingerprint(folder) == before


@pytest.mark.e2e
def test_a_sweep_goes_on_past_a_job_whose_folder_a_live_run_holds(tmp_path):
    sweep = tmp_path / "sweep"
    busy = sweep / "seed-2"
    with held_by_another_process(busy) as pid:
        proc = run_py("-m", *FAST, "seed=2,1", f"paths.cache_dir={tmp_path / 'cache'}",
                      f"hydra.sweep.dir={sweep}", "hydra.sweep.subdir=seed-${seed}")
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0 and f"run folder {busy} is in use by pid {pid}" in output, output[-3000:]
    assert not (busy / "results.json").exists() and not (busy / "failed.json").exists()
    ran = json.loads((sweep / "seed-1" / "results.json").read_text())
    assert ran["status"] == "complete"  # the job after the refused one ran


def job_config(folder: Path) -> DictConfig:
    """What Hydra hands its callbacks for a run, and for a job, in the keys OutputFolderCheck reads."""
    return OmegaConf.create({"hydra": {"run": {"dir": str(folder)}, "runtime": {"output_dir": str(folder)}}})


def test_a_run_takes_its_folder_lock_once_for_its_whole_life(tmp_path, monkeypatch):
    folder = tmp_path / "run"
    entered = []
    enter = RunFolderLock.__enter__
    monkeypatch.setattr(RunFolderLock, "__enter__", lambda lock: entered.append(lock.folder) or enter(lock))
    cfg = OmegaConf.create({"paths": {"output_dir": str(folder), "cache_dir": str(tmp_path / "cache")}})
    hook = OutputFolderCheck()
    hook.on_run_start(config=job_config(folder))
    hook.on_job_start(config=job_config(folder), task_function=print)
    with run_ends(cfg):
        with pytest.raises(FolderInUse):  # held, not nested: another open of the lock is refused
            RunFolderLock(folder).__enter__()
    with pytest.raises(FolderInUse):  # still held after the run's own error handling, until Hydra's end
        RunFolderLock(folder).__enter__()
    hook.on_job_end(config=job_config(folder), job_return=None)
    hook.on_run_end(config=job_config(folder))
    assert entered == [folder, folder, folder]  # the run's once, and the two refused probes
    with RunFolderLock(folder):  # released at the run's end
        pass


def test_a_lock_left_by_a_killed_process_is_taken_over_once(tmp_path, caplog):
    folder = tmp_path / "run"
    killed = subprocess.Popen([sys.executable, "-c", "import os, signal, sys; "
                               "from bert_repro.lifecycle.locks import RunFolderLock; "
                               "RunFolderLock(sys.argv[1]).__enter__(); "
                               "os.kill(os.getpid(), signal.SIGKILL)", str(folder)], cwd=REPO)
    assert killed.wait(timeout=60) == -signal.SIGKILL
    assert RunFolder(folder).lock.read_text()  # its record stays, its OS lock went with it
    with caplog.at_level(logging.INFO, logger="bert_repro.lifecycle.locks"):
        with RunFolderLock(folder):
            pass
        lines = [r.getMessage() for r in caplog.records]
        assert len(lines) == 1, lines
        assert f"taking over the lock left by pid {killed.pid} on host {socket.gethostname()}" in lines[0]
        caplog.clear()
        with RunFolderLock(folder):  # released in order: nothing left to take over
            pass
        assert not caplog.records


def test_a_multirun_job_stopped_by_a_signal_releases_its_lock_in_order(tmp_path):
    """A stopped job leaves the process through SystemExit, where Hydra calls no on_job_end: the next run of
    the folder (the table's resume) finds nothing to take over."""
    folder = tmp_path / "job"
    code = ("import sys; from omegaconf import OmegaConf; "
            "from bert_repro.lifecycle.hydra_hooks import OutputFolderCheck; "
            "OutputFolderCheck().on_job_start(config=OmegaConf.create("
            "{'hydra': {'runtime': {'output_dir': sys.argv[1]}}})); sys.exit(130)")
    stopped = subprocess.run([sys.executable, "-c", code, str(folder)], cwd=REPO, timeout=60)
    assert stopped.returncode == 130
    assert RunFolder(folder).lock.read_text() == ""


def test_ddp_ranks_run_under_their_launchers_lock(tmp_path, monkeypatch):
    folder = tmp_path / "run"
    with held_by_another_process(folder) as pid:
        with pytest.raises(FolderInUse, match=f"run folder {folder} is in use by pid {pid}"):
            with RunFolderLock(folder):
                pass
        for rank in ("LOCAL_RANK", "RANK", "SLURM_PROCID"):  # Lightning's DDP children, torchrun, SLURM
            with monkeypatch.context() as env:
                env.setenv(rank, "1")
                with RunFolderLock(folder):
                    pass
