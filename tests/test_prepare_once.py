"""Tokenization once, with no rank timing out while another tokenizes: two ranks started together, as
torchrun or SLURM start them, and a deliberately slow tokenization (SLOW_S) longer than the process group's
timeout (TIMEOUT_S: a gloo barrier kept waiting that long fails). Rank 0 tokenizes in the DataModule's
prepare_data (data/base.py) while rank 1 waits in Lightning's barrier around it, which has no timeout; setup
then reads the cache on each rank. Tokenizing in setup instead would tokenize twice (two marker files)."""

import os
import subprocess
import sys
import time

import pytest

from bert_repro.data.glue import GlueDataModule

from .conftest import REPO
from .test_ddp import rte_common

SLOW_S, TIMEOUT_S = 10, 8  # tokenization, and the longest a rank may wait in a collective


class SlowGlue(GlueDataModule):
    """GLUE whose tokenization takes SLOW_S longer on a cold cache; each time leaves a file to count."""

    def build(self, training: bool = True) -> None:
        if not any(self.cache_dir.glob("tokens-*.arrow")):
            (self.cache_dir / f"slow-tokenization-{os.getpid()}").touch()
            time.sleep(SLOW_S)
        super().build(training)


@pytest.mark.e2e
def test_ranks_started_together_tokenize_once_and_never_wait_in_a_collective(tmp_path, shared_data,
                                                                           minilm_dir):
    # one epoch: the ranks meet in every kind of collective a fit has (set-up, steps, Dev, checkpoint)
    common = [o for o in rte_common(tmp_path, shared_data, minilm_dir) if not o.startswith("optim.epochs=")]
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
               str(REPO / "src" / "train.py"), *common,
               "trainer=ddp_cpu", f"trainer.strategy.timeout.seconds={TIMEOUT_S}",
               f"data._target_={__name__}.SlowGlue", f"hydra.run.dir={tmp_path / 'run'}", "optim.epochs=1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert len(list((tmp_path / "cache").rglob("slow-tokenization-*"))) == 1  # one rank tokenized
    assert (tmp_path / "run" / "results.json").is_file()
