"""How a run ends (lifecycle/exits.py), in this process: each failure its exit code and one message, and a
DDP rank whose collective broke because another rank stopped says so in a line, not a gloo traceback."""

import pytest
from omegaconf import OmegaConf

from bert_repro.lifecycle.checks import TRACEBACK_HINT, UsageError
from bert_repro.lifecycle.exits import NonFiniteLoss, launch_error, peer_stopped, run_ends
from bert_repro.lifecycle.folder import RunFolder


class DistBackendError(RuntimeError):  # torch.distributed's kind, by name: this test needs no process group
    pass


def cfg(tmp_path):
    return OmegaConf.create({"paths": {"output_dir": str(tmp_path / "run"), "cache_dir": str(tmp_path / "c")},
                             "task": {"name": "mrpc", "monitor": "val/acc"}})


@pytest.mark.parametrize("error,code", [
    (UsageError("data.batch_size=0: expected a positive number"), 2),
    (NonFiniteLoss("training loss is nan at step 3"), 3),
    (DistBackendError("[../gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:1234"), 1),
    (RuntimeError("Connection reset by peer"), 1),
])
def test_each_failure_ends_with_its_code_and_one_message(tmp_path, caplog, error, code):
    with pytest.raises(SystemExit) as exit_, run_ends(cfg(tmp_path), record=False):
        raise error
    assert exit_.value.code == code
    said = caplog.text
    assert (str(error) in said) != peer_stopped(error)  # a broken collective: the other rank's words stand
    assert not RunFolder(tmp_path / "run").results.exists()


def test_a_bug_keeps_its_traceback(tmp_path):
    with pytest.raises(ZeroDivisionError), run_ends(cfg(tmp_path), record=False):
        raise ZeroDivisionError("a bug")


def test_launch_error_names_the_cause():
    compose = ("In 'train': Could not find 'ablation/feature_x'\n\nAvailable options in 'ablation':\n\tnone\n"
               "Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.\n")
    assert launch_error(compose) == "In 'train': Could not find 'ablation/feature_x'"
    crash = ("[2026-01-01 00:00:00,000][HYDRA] Launching 1 jobs locally\n"
             "Error executing job with overrides: ['a=1']\n"
             "Traceback (most recent call last):\n  File \"x.py\", line 1\n"
             "RuntimeError: shapes do not match\n"
             "\nSet the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.\n")
    assert launch_error(crash) == "RuntimeError: shapes do not match"
    logged = f"[2026-01-01 00:00:00,000][x][ERROR] - data.max_seq_length=-1: expected more {TRACEBACK_HINT}\n"
    assert launch_error(crash + logged) == "data.max_seq_length=-1: expected more"  # run_ends' words win
