"""Warm starts (bert_repro.tables.warm): a script forked from the forkserver sees what the same command
started cold sees (arguments, environment, working directory, threads, its own process group, exit status,
atexit, SIGINT as KeyboardInterrupt, its command line in /proc), and a command whose import-time environment
differs from the forkserver's starts cold."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from bert_repro.lifecycle.locks import live_processes
from bert_repro.tables import warm

PROBE = r'''
import atexit, json, os, sys, torch
atexit.register(lambda: print("atexit ran", flush=True))
print(json.dumps({"argv": sys.argv, "cwd": os.getcwd(), "probe": os.environ.get("PROBE"),
                  "threads": torch.get_num_threads(), "group_leader": os.getpgid(0) == os.getpid(),
                  "main": __name__, "pid": os.getpid()}), flush=True)
if sys.argv[1] == "wait":
    try:
        open(sys.argv[2], "w").close()
        __import__("time").sleep(60)
    except KeyboardInterrupt:
        print("KeyboardInterrupt", flush=True)
        sys.exit(5)
sys.exit(int(sys.argv[2]))
'''


@pytest.fixture
def probe(tmp_path):
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    return script


def observed(proc, out) -> tuple[int, dict, str]:
    code = proc.wait(120)
    text = out.read_text()
    return code, json.loads(text.splitlines()[0]), text


@pytest.mark.slow
def test_a_warm_run_sees_what_a_cold_one_sees(probe, tmp_path):
    # the forkserver's environment: an earlier test may have started it with other variables than now
    env = {**warm.environment(), "PROBE": "x y", "OMP_NUM_THREADS": "2"}
    cmd = [sys.executable, str(probe), "exit", "3"]
    cold_out, warm_out = tmp_path / "cold.log", tmp_path / "warm.log"
    with cold_out.open("w") as f:
        cold = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)
    started = warm.start(cmd, cwd=tmp_path, env=env, stdout=warm_out)
    assert isinstance(started, warm.WarmProcess)
    cold_code, cold_seen, cold_text = observed(cold, cold_out)
    warm_code, warm_seen, warm_text = observed(started, warm_out)
    assert warm_code == cold_code == 3
    assert warm_seen.pop("pid") == started.pid and cold_seen.pop("pid") == cold.pid
    assert warm_seen == cold_seen == {"argv": [str(probe), "exit", "3"], "cwd": str(tmp_path), "probe": "x y",
                                      "threads": 2, "group_leader": True, "main": "__main__"}
    assert "atexit ran" in warm_text and "atexit ran" in cold_text


@pytest.mark.slow
def test_sigint_is_a_keyboard_interrupt_and_the_command_line_names_the_run(probe, tmp_path):
    ready = tmp_path / "ready"
    marker = tmp_path / "hydra.sweep.dir=x"  # live_processes finds a sweep by this argument
    cmd = [sys.executable, str(probe), "wait", str(ready), f"hydra.sweep.dir={marker}"]
    started = warm.start(cmd, cwd=tmp_path, env=warm.environment(), stdout=tmp_path / "out.log")
    deadline = time.monotonic() + 60
    while not ready.exists():
        assert time.monotonic() < deadline and started.poll() is None, (tmp_path / "out.log").read_text()
        time.sleep(0.05)
    assert live_processes(marker) == [started.pid]
    os.killpg(started.pid, signal.SIGINT)
    assert started.wait(60) == 5 and "KeyboardInterrupt" in (tmp_path / "out.log").read_text()


@pytest.mark.slow
def test_an_environment_read_at_import_that_differs_starts_cold(probe, tmp_path):
    cmd = [sys.executable, str(probe), "exit", "0"]
    # the forkserver runs, with the environment warm runs are compared with
    assert warm.start(cmd, cwd=tmp_path, env=warm.environment(), stdout=tmp_path / "first.log").wait(120) == 0
    env = warm.environment()
    assert warm.start(cmd, cwd=tmp_path, env={**env, "HF_HOME": str(tmp_path / "hf")},
                      stdout=tmp_path / "out.log") is None
    assert warm.start(cmd, cwd=tmp_path, env={**env, "LOCAL_RANK": "1"}, stdout=tmp_path / "o") is None
    assert warm.start(cmd, cwd=tmp_path, env={**env, warm.OPTION: "0"}, stdout=tmp_path / "o") is None
    assert warm.start([sys.executable, "-c", "pass"], cwd=tmp_path, env=env, stdout=tmp_path / "o") is None
    # read when a run uses it: warm all the same
    started = warm.start(cmd, cwd=tmp_path, env={**env, "PL_GLOBAL_SEED": "7"}, stdout=tmp_path / "o")
    assert started is not None and started.wait(120) == 0
    # set by Lightning, torch, scikit-learn and a Ray driver as a run in this process goes, read when used
    ran = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"), "PYTORCH_NVML_BASED_CUDA_CHECK": "0",
           "KMP_DUPLICATE_LIB_OK": "True", "KMP_INIT_AT_FORK": "FALSE",
           "PYTHONBREAKPOINT": "ray.util.rpdb._driver_set_trace"}
    started = warm.start(cmd, cwd=tmp_path, env={**env, **ran}, stdout=tmp_path / "o")
    assert started is not None and started.wait(120) == 0
