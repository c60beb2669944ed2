"""FSDP on CPU: trainer=fsdp_cpu (FSDP2's fully_shard over 2 gloo processes, ModelParallelStrategy),
stopped after its first epoch and resumed from that checkpoint, trains like one process, epoch by epoch, to
the same weights; its checkpoint converts to Hugging Face format. torch 2.13 runs every piece of this on CPU
(32-true); the GPU check (benchmarks/gpu_check.py) runs trainer=fsdp in bf16 on a GPU. The strategies'
arguments from speed: and the mesh are checked without a run."""

import pytest

from bert_repro.convert import load_checkpoint
from bert_repro.keys import is_science
from bert_repro.lifecycle.checks import UsageError, check_inputs
from bert_repro.lifecycle.trainer import build_strategy

from .conftest import run_py
from .test_config import compose_cfg
from .test_ddp import max_difference, rte_common, train_runs, weights

# Lightning's EarlyStopping, told that any loss is good enough: the fit ends after its first Dev evaluation,
# leaving last.ckpt at the end of epoch 1 (a callbacks. key: the same science, so it resumes)
STOP_AFTER_EPOCH_1 = ["+callbacks.stop._target_=lightning.pytorch.callbacks.EarlyStopping",
                      "+callbacks.stop.monitor=val/loss", "+callbacks.stop.stopping_threshold=1e9"]


@pytest.fixture(scope="module")
def fsdp(tmp_path_factory, shared_data, minilm_dir):
    tmp = tmp_path_factory.mktemp("fsdp")
    common = rte_common(tmp, shared_data, minilm_dir)
    half = tmp / "half" / "checkpoints" / "last.ckpt"
    return tmp, train_runs(tmp, common, {"one": ["trainer=cpu"],
                                         "half": ["trainer=fsdp_cpu", *STOP_AFTER_EPOCH_1],
                                         "resumed": ["trainer=fsdp_cpu", f"ckpt_path={half}"]},
                            here=("one",))


@pytest.mark.e2e
def test_two_sharded_processes_train_like_one_across_a_resume(fsdp):
    tmp, runs = fsdp
    one, half, resumed = runs["one"], runs["half"], runs["resumed"]
    assert (half["world_size"], half["per_device_batch"], half["global_step"]) == (2, 8, 4)
    assert resumed["resumed_from"] and (resumed["world_size"], resumed["global_step"]) == (2, 8)
    # the Dev loss curve: epoch 1 from before the resume (the checkpoint's history), epoch 2 after it
    curve = [e["val/loss"] for e in resumed["metrics"]["per_epoch"]]
    assert curve == pytest.approx([e["val/loss"] for e in one["metrics"]["per_epoch"]], abs=1e-5)
    # the optimizer state came back too: Adam restarted from zero moments would take other steps
    assert max_difference(weights(tmp / "one"), weights(tmp / "resumed")) < 1e-5


@pytest.mark.e2e
def test_a_sharded_runs_checkpoint_converts_to_hugging_face(fsdp, tmp_path):
    tmp, _ = fsdp
    out = tmp_path / "hf"
    proc = run_py("to-hf", str(tmp / "resumed" / "checkpoints" / "last.ckpt"), str(out),
                  module="bert_repro.convert")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    exported, reference = load_checkpoint(out), load_checkpoint(tmp / "one" / "checkpoints" / "last.ckpt")
    assert exported.state_dict.keys() == reference.state_dict.keys()  # whole tensors, no shards or DTensors
    assert max_difference(exported.state_dict, reference.state_dict) < 1e-5


def test_fsdp_shards_every_rank_with_no_tensor_parallelism():
    """trainer=fsdp as a GPU node composes it: the data-parallel size is every device of every node."""
    from lightning.pytorch.strategies import ModelParallelStrategy

    strategy = build_strategy(compose_cfg(["trainer=fsdp", "trainer.devices=4", "trainer.num_nodes=2"]))
    assert isinstance(strategy, ModelParallelStrategy)
    assert (strategy._data_parallel_size, strategy._tensor_parallel_size) == (8, 1)


@pytest.mark.slow
def test_ddp_communication_options_are_speed_keys_that_reach_torch(tmp_path):
    from lightning.pytorch.strategies import DDPStrategy
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    plain = build_strategy(compose_cfg(["trainer=ddp"]))
    assert isinstance(plain, DDPStrategy) and plain._ddp_comm_hook is None
    assert plain._ddp_kwargs["bucket_cap_mb"] is None  # torch's 25 MB
    fast = build_strategy(compose_cfg(["trainer=ddp", "speed.grad_allreduce=bf16", "speed.bucket_cap_mb=50"]))
    assert fast._ddp_comm_hook is default_hooks.bf16_compress_hook and fast._ddp_kwargs["bucket_cap_mb"] == 50
    assert not is_science("speed.grad_allreduce") and not is_science("speed.bucket_cap_mb")
    with pytest.raises(UsageError, match=r"grad_allreduce=bf16 runs on CUDA GPUs only \(torch: \"BF16 all"):
        # refused with the inputs, before any data is read, not dropped silently by Lightning on CPU
        check_inputs(compose_cfg(["trainer=ddp_cpu", "speed.grad_allreduce=bf16"]), tmp_path)
