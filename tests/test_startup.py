"""What needs no model starts without torch: `src/train.py --help` and `--cfg job` (torch and Lightning load
when a run starts), and the table collector, which reads JSON. No timing in tests: this checks the cause.
A signal while an entry's modules load ends it with one line and 128 + n, as one later does."""

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .conftest import REPO

PROBE = """
import runpy, sys
sys.argv = {argv!r}
try:
    runpy.{runner}({target!r}, run_name="__main__"{extra})
except SystemExit as exit_:
    assert exit_.code in (0, None), exit_.code
print("heavy:", sorted(m for m in ("torch", "lightning", "transformers") if m in sys.modules))
"""


def heavy_imports(argv: list[str], runner: str, target: str, extra: str = "") -> str:
    code = PROBE.format(argv=argv, runner=runner, target=target, extra=extra)
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize("args", [["--help"], ["--cfg", "job", "task=mrpc", "model=large"]])
@pytest.mark.slow
def test_train_py_help_and_cfg_do_not_import_torch(args):
    train = str(REPO / "src" / "train.py")
    assert heavy_imports([train, *args], "run_path", train) == "heavy: []"


@pytest.mark.slow
def test_the_table_collector_does_not_import_torch(tmp_path):
    argv = ["bert_repro.tables", "collect", "table5_demo", "--scale", "smoke", "--logger", "none",
            "--runs-dir", str(tmp_path / "runs"), "--results-dir", str(tmp_path / "results")]
    assert heavy_imports(argv, "run_module", "bert_repro.tables", ", alter_sys=True") == "heavy: []"
    assert (tmp_path / "results" / "table5_demo.md").is_file()  # it did collect


@pytest.mark.slow
def test_a_finished_run_prints_its_result_without_torch(good):
    """Finished is finished: the same command again answers from results.json, no torch, nothing rewritten."""
    from .conftest import FAST, fingerprint

    _, out, cache, _ = good
    before = fingerprint(out)
    train = str(REPO / "src" / "train.py")
    argv = [train, *FAST, f"paths.cache_dir={cache}", f"hydra.run.dir={out}"]
    assert heavy_imports(argv, "run_path", train) == "heavy: []"
    assert fingerprint(out) == before


@pytest.mark.e2e
def test_force_reruns_a_finished_run_from_scratch(good, tmp_path):
    import json
    import shutil

    from .conftest import FAST, run_py

    _, out, cache, _ = good
    copy = tmp_path / "again"
    shutil.copytree(out, copy)  # the good run stays as it was for the other tests
    proc = run_py(*FAST, f"paths.cache_dir={cache}", f"hydra.run.dir={copy}", "+force=true")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    said = proc.stdout + proc.stderr
    assert "is finished" not in said and "resuming from" not in said
    results = json.loads((copy / "results.json").read_text())
    assert results["status"] == "complete" and results["resumes"] == 0 and results["resumed_from"] is None
    assert results["global_step"] == 4
    # Dev once at the end: the fit's last evaluation (step 4) is the final one, never a second pass
    assert said.count("Dev at step 4") == 1 and "Dev at step 2" in said


# libyaml's extension: it loads with OmegaConf, midway through every entry's imports of Hydra
LOADING = "_yaml."


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("entry", [["src/train.py", "task=mrpc", "model=tiny"],
                                   ["src/evaluate.py", "task=mrpc", "model=tiny"],
                                   ["-m", "bert_repro.tables", "plan", "table5", "--scale", "smoke"]],
                         ids=["train", "evaluate", "tables"])
def test_a_signal_while_an_entry_loads_is_one_line_and_128_plus_n(tmp_path, entry, signum):
    """Ctrl-C or SIGTERM before any handler of the run is there (Hydra still importing): no traceback, no
    death by the signal, nothing written, and how to start again."""
    where = ["--runs-dir", str(tmp_path)] if "-m" in entry else [f"hydra.run.dir={tmp_path / 'run'}"]
    proc = subprocess.Popen([sys.executable, *entry, *where], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    maps, deadline = Path(f"/proc/{proc.pid}/maps"), time.monotonic() + 60
    while proc.poll() is None and LOADING not in maps.read_text() and time.monotonic() < deadline:
        time.sleep(0.001)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signum, err[-3000:]
    assert len(err.strip().splitlines()) == 1 and signum.name in err, err[-3000:]
    assert "run the same command again" in err and "Traceback" not in err
    assert not any(tmp_path.iterdir())


def test_importing_the_package_holds_no_signal():
    """Only the entries hold SIGINT and SIGTERM: a notebook or a test importing the package keeps Python's."""
    code = ("import signal, bert_repro.lifecycle.run, bert_repro.tables.__main__; "
            "print(signal.getsignal(signal.SIGINT) is signal.default_int_handler, "
            "signal.getsignal(signal.SIGTERM) is signal.SIG_DFL)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.stdout.split() == ["True", "True"], proc.stderr[-2000:]
