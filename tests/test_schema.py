"""Ranges and the model's shape, declared in config.py and checked as a job starts (lifecycle/checks.py's
validate, for src/train.py and src/evaluate.py alike): a value out of range fails in a second or two,
naming the key and what was expected, before any download, tokenizer training or Trainer."""

import os
import resource
import subprocess
import sys

import pytest

from bert_repro.config import check
from bert_repro.tables.compose import compose_once, composing

from .conftest import CONF, REPO


def composed(config: str, overrides: list[str]):
    with composing():
        return compose_once(config, overrides)


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


@pytest.mark.slow
def test_every_shipped_option_is_in_range():
    """Each task with a model (in turn, so every model is met), each scale and experiment. ablation/ and
    debug/ set no key that has a range (mask shares are checked by the data module)."""
    tasks, models = options("task"), options("model")
    runs = [[f"task={t}", f"model={models[i % len(models)]}"] for i, t in enumerate(tasks)]
    runs += [[f"scale={s}", "data.corpus=/c"] for s in options("scale")]
    runs += [[f"experiment={e}", "ckpt_path=/phase1/last.ckpt"] for e in options("experiment")]
    assert len(models) <= len(tasks)
    for overrides in runs:
        check(composed("train", overrides))


OUT_OF_RANGE = [  # (overrides, message)
    (["optim.warmup_ratio=5"], "optim.warmup_ratio=5: expected a fraction in [0, 1]"),
    (["optim.betas=[0.9,1.5]"], "optim.betas=[0.9, 1.5]: expected two decay rates in [0, 1)"),
    (["task=mrpc", "optim.warmup_steps=-1"], "optim.warmup_steps=-1: expected 0 or more steps, or null"),
    (["model.hidden_dropout=1"], "model.hidden_dropout=1: expected a fraction in [0, 1)"),
    (["model.num_layers=0"], "model.num_layers=0: expected a positive whole number of layers"),
    (["model.hidden_size=770", "model.num_heads=12"],
     "model.hidden_size=770 is not divisible by model.num_heads=12: expected a hidden size that splits"),
    (["data.max_seq_length=-1"], "data.max_seq_length=-1: expected a positive whole number of tokens"),
    (["scale.pretrain.max_seq_length=0"],
     "data.max_seq_length=0 (from ${scale.pretrain.max_seq_length}): expected a positive whole number"),
    (["data.masked_lm_prob=1.5"], "data.masked_lm_prob=1.5: expected a fraction in [0, 1]"),
    (["task=squad_v1", "data.doc_stride=abc"], "data.doc_stride=abc: expected a positive whole number"),
    (["task=mrpc", "data.max_train_examples=0"], "data.max_train_examples=0: expected a positive whole"),
    (["task=rte", "data.dev_from_train=1.5"],
     "data.dev_from_train=1.5: expected a number of rows, or a fraction in (0, 1)"),
]


@pytest.mark.parametrize("overrides,message", OUT_OF_RANGE, ids=[" ".join(o) for o, _ in OUT_OF_RANGE])
def test_out_of_range_values_are_named_with_what_was_expected(overrides, message):
    with pytest.raises(ValueError) as err:
        check(composed("train", overrides))
    assert str(err.value).startswith(message)


@pytest.mark.parametrize("script,args,message", [
    ("train.py", ["optim.warmup_ratio=5"], "optim.warmup_ratio=5: expected a fraction in [0, 1]"),
    ("train.py", ["data.max_seq_length=-1"], "data.max_seq_length=-1: expected a positive whole number"),
    ("train.py", ["model.hidden_size=770", "model.num_heads=12"],
     "model.hidden_size=770 is not divisible by model.num_heads=12"),
    ("evaluate.py", ["task=mrpc", "init=/no/such.ckpt", "optim.warmup_ratio=-0.1"],
     "optim.warmup_ratio=-0.1: expected a fraction in [0, 1]"),
], ids=["warmup-ratio", "max-seq-length", "heads-do-not-divide-hidden", "evaluate"])
@pytest.mark.slow
def test_the_command_fails_within_two_seconds_before_any_work(tmp_path, script, args, message):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(
        [sys.executable, str(REPO / "src" / script), "model=tiny", "logger=none",
         f"paths.cache_dir={tmp_path / 'cache'}", f"hydra.run.dir={tmp_path / 'run'}", *args],
        cwd=REPO, capture_output=True, text=True, timeout=60, env={**os.environ, "OMP_NUM_THREADS": "1"})
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2 and message in output and "Traceback" not in output, output[-3000:]
    # CPU seconds, not the wall clock, which on a shared machine measures the neighbours
    # the issue asks under 2 s, which noise crosses (docs/benchmarks.md); 2.5 still tells a refusal from one
    # after torch loads (~10 s)
    assert after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime < 2.5
    assert not (tmp_path / "cache").exists() and not (tmp_path / "run" / "checkpoints").exists()
