"""Distributed parity on CPU: trainer=ddp_cpu (2 gloo processes) trains on the same global batches as one
process and ends with the same weights and Dev numbers; each Dev example is counted once although 277 does
not divide by 2; results.json is written once. A local multirun over several devices is refused, and
trainer=fsdp says on CPU that it needs GPUs."""

import json

import pytest

from bert_repro.reliability import safe_load

from .conftest import train_py


def train(*overrides, timeout=900):
    proc = train_py(*overrides, timeout=timeout)
    return proc, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def rte(tmp_path_factory, shared_data, minilm_dir):
    shared = shared_data
    tmp = tmp_path_factory.mktemp("ddp")
    # dropout off: each rank draws its own masks, so only then is the arithmetic the same
    common = ["task=rte", "model=tiny", "logger=csv", "trainer.enable_progress_bar=false",
              "data.batch_size=16", "data.max_train_examples=64", "optim.epochs=2", "optim.lr=1e-3",
              "model.hidden_dropout=0", "model.attention_dropout=0", f"data.tokenizer={minilm_dir}",
              f"paths.shared_data={shared}", f"paths.cache_dir={tmp / 'cache'}"]
    runs = {}
    for name, trainer in (("one", "trainer=cpu"), ("two", "trainer=ddp_cpu")):
        proc, output = train(*common, trainer, f"hydra.run.dir={tmp / name}")
        assert proc.returncode == 0, output[-3000:]
        runs[name] = json.loads((tmp / name / "results.json").read_text())
    return tmp, runs


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
    w1 = safe_load(tmp / "one" / "checkpoints" / "last.ckpt")["state_dict"]
    w2 = safe_load(tmp / "two" / "checkpoints" / "last.ckpt")["state_dict"]
    assert max(float((w1[k] - w2[k]).abs().max()) for k in w1) < 1e-5  # gradients all-reduced = one batch's


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


def test_fsdp_on_cpu_says_it_needs_gpus(tmp_path):
    proc, output = train("model=tiny", "trainer=fsdp", "trainer.accelerator=cpu", "trainer.devices=2",
                         "trainer.precision=32-true", "data.corpus=builtin:pydoc",
                         f"hydra.run.dir={tmp_path / 'run'}", f"paths.cache_dir={tmp_path / 'cache'}",
                         timeout=300)
    assert proc.returncode == 2 and "trainer=fsdp needs GPUs" in output and "Traceback" not in output
    assert not (tmp_path / "run" / "results.json").exists()
