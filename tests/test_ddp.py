"""Distributed parity on CPU: trainer=ddp_cpu (2 gloo processes) trains on the same global batches as one
process and ends with the same weights and Dev numbers; each Dev example is counted once although 277 does
not divide by 2; results.json is written once. DDP's bf16 gradient all-reduce (speed.grad_allreduce=bf16,
torch's bf16_compress_hook, CUDA only) changes the loss by bf16 rounding only. A local multirun over several
devices is refused. (FSDP: tests/test_fsdp.py.)"""

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from bert_repro.lifecycle.checks import BF16_HOOK_NEEDS
from bert_repro.lifecycle.reliability import safe_load

from .conftest import REPO, train_py
from .helpers import ended, started


def train(*overrides, timeout=900, new_process=True):
    """src/train.py ``overrides``: in this process, or (DDP ranks) in a process of its own, which Lightning's
    launcher starts the other ranks from (helpers.started)."""
    if not new_process:
        proc = train_py(*overrides)
        return proc, proc.stdout + proc.stderr
    with tempfile.TemporaryDirectory() as tmp:
        cmd, log = [sys.executable, str(REPO / "src" / "train.py"), *overrides], Path(tmp, "output.log")
        code, output = ended(started(cmd, log), log, timeout)
    return subprocess.CompletedProcess(cmd, code, output, ""), output


def rte_common(tmp, shared_data, minilm_dir) -> list[str]:
    """A 2-epoch RTE fine-tune of 8 steps that one process and several train alike (test_fsdp.py too)."""
    # dropout off: each rank draws its own masks, so only then is the arithmetic the same
    return ["task=rte", "model=tiny", "logger=csv", "trainer.enable_progress_bar=false",
            "data.batch_size=16", "data.max_train_examples=64", "optim.epochs=2", "optim.lr=1e-3",
            "model.hidden_dropout=0", "model.attention_dropout=0", f"data.tokenizer={minilm_dir}",
            "checkpoint.keep_last=true",  # the final weights, compared below
            f"paths.shared_data={shared_data}", f"paths.cache_dir={tmp / 'cache'}"]


def train_runs(tmp, common: list[str], runs: dict[str, list[str]],
               here: tuple[str, ...] = ()) -> dict[str, dict]:
    """Each of ``runs`` (name: its own overrides) trained into ``tmp``/name: their results.json. Those named
    in ``here`` (one process, one device) run in this process; the others in processes of their own, as
    ranks need."""
    results = {}
    for name, overrides in runs.items():
        proc, output = train(*common, *overrides, f"hydra.run.dir={tmp / name}", new_process=name not in here)
        assert proc.returncode == 0, output[-3000:]
        results[name] = json.loads((tmp / name / "results.json").read_text())
    return results


def weights(run_dir) -> dict:
    return safe_load(run_dir / "checkpoints" / "last.ckpt")["state_dict"]


def max_difference(a: dict, b: dict) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.fixture(scope="module")
def rte(tmp_path_factory, shared_data, minilm_dir):
    tmp = tmp_path_factory.mktemp("ddp")
    return tmp, train_runs(tmp, rte_common(tmp, shared_data, minilm_dir), {"one": ["trainer=cpu"],
                                                                           "two": ["trainer=ddp_cpu"]},
                           here=("one",))


def test_two_processes_train_like_one_with_the_same_global_batch(rte):
    tmp, runs = rte
    one, two = runs["one"], runs["two"]
    assert (one["world_size"], one["per_device_batch"], one["accumulation"]) == (1, 16, 1)
    assert (two["world_size"], two["per_device_batch"], two["accumulation"]) == (2, 8, 1)
    assert one["global_step"] == two["global_step"] == 8
    # the same examples every epoch (the sampler shards each global batch, it does not reshuffle per rank)
    for a, b in zip(one["metrics"]["per_epoch"], two["metrics"]["per_epoch"]):
        assert a["train/real_tokens"] == b["train/real_tokens"]
        assert a["val/loss"] == pytest.approx(b["val/loss"], abs=1e-5)  # the Dev loss curve, epoch by epoch
    # gradients all-reduced = one batch's
    assert max_difference(weights(tmp / "one"), weights(tmp / "two")) < 1e-5


@pytest.mark.skipif(not torch.cuda.is_available(), reason=f"torch 2.13 refuses the bf16 hook without CUDA: "
                    f"'{BF16_HOOK_NEEDS}' (DistributedDataParallel.register_comm_hook)")
def test_bf16_gradient_allreduce_changes_the_loss_by_bf16_rounding_only(tmp_path, shared_data, minilm_dir):
    """bf16 keeps 8 significant bits: each gradient is rounded at a relative 2**-9 when cast (and again when
    ranks' shares are summed). Adam divides each update by the gradient's own running scale, so those
    relative errors reach the weights (and the loss) at that order, not amplified: the Dev loss stays within
    2**-8 relative of the fp32 all-reduce's (one bf16 ulp), epoch by epoch; the weights differ (it ran).
    One GPU is enough: DDP runs the hook on a world of one too; 32-true keeps the rest of the step exact."""
    runs = train_runs(tmp_path, [*rte_common(tmp_path, shared_data, minilm_dir), "trainer=ddp",
                                 "trainer.devices=1", "trainer.precision=32-true", "speed.bucket_cap_mb=1"],
                      {"fp32": [], "bf16": ["speed.grad_allreduce=bf16"]})
    assert runs["bf16"]["global_step"] == runs["fp32"]["global_step"] == 8
    for a, b in zip(runs["fp32"]["metrics"]["per_epoch"], runs["bf16"]["metrics"]["per_epoch"]):
        assert b["val/loss"] == pytest.approx(a["val/loss"], rel=2 ** -8)
    assert max_difference(weights(tmp_path / "fp32"), weights(tmp_path / "bf16")) > 0


def test_dev_examples_counted_once_and_results_written_once(rte):
    tmp, runs = rte
    one, two = runs["one"], runs["two"]
    assert one["data_sizes"]["dev"] == 277  # odd: Lightning's sampler would repeat one example on rank 1
    # accuracy and predicted-class shares are counts over the 277: one duplicate would change them
    assert two["metrics"]["final"]["val/acc"] == one["metrics"]["final"]["val/acc"]
    assert two["metrics"]["final"]["val/top_class_share"] == one["metrics"]["final"]["val/top_class_share"]
    assert two["metrics"]["final"]["val/loss"] == pytest.approx(one["metrics"]["final"]["val/loss"], abs=1e-5)
    assert sorted(str(p.relative_to(tmp)) for p in tmp.rglob("results.json")) == ["one/results.json",
                                                                                  "two/results.json"]
    # rank 1 ran in the same folder, and wrote no results
    assert (tmp / "two" / "train_ddp_process_1.log").is_file()


def test_local_multirun_over_several_devices_is_refused(tmp_path):
    proc, output = train("-m", "model=tiny", "trainer=ddp_cpu", "seed=1,2", "data.corpus=builtin:pydoc",
                         f"hydra.sweep.dir={tmp_path / 'sweep'}", f"paths.cache_dir={tmp_path / 'cache'}",
                         timeout=300)
    assert proc.returncode != 0
    assert "a local multirun (-m) with 2 devices" in output and "hydra/launcher=submitit_slurm" in output
    assert not list(tmp_path.rglob("results.json")) and not list(tmp_path.rglob("*.ckpt"))
