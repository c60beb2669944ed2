"""Inputs that would otherwise fail late, or not at all: refused before any work, each naming the input."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from bert_repro.lifecycle.folder import RunFolder

log = logging.getLogger(__name__)


class UsageError(Exception):
    """A wrong input (unknown task module, inconsistent batch sizes, missing data): message, exit code 2."""


TRACEBACK_HINT = "(set BERT_REPRO_TRACEBACK=1 for the traceback)"  # after a wrong input's message


class SweepUsageError(UsageError):
    """A wrong input common to every job of a multirun: the whole sweep stops, no job is recorded."""


# torch 2.13's DDP.register_comm_hook refuses its bf16 hook without CUDA, in these words; Lightning 2.6 passes
# comm hooks on CUDA only and would drop it silently (trainer.build_strategy)
BF16_HOOK_NEEDS = "BF16 all reduce communication hook required CUDA 11+ and NCCL 2.10+ or XPU and XCCL"


def world_size(trainer_cfg: DictConfig) -> int:
    devices, nodes = trainer_cfg.devices, int(trainer_cfg.get("num_nodes", 1))
    if isinstance(devices, int):
        count = devices
    elif isinstance(devices, str) and devices.lstrip("-").isdigit():
        count = int(devices)
    elif devices in (-1, "auto") and trainer_cfg.accelerator in ("gpu", "cuda"):
        import torch  # here only: src/train.py checks a run's inputs before torch loads

        count = torch.cuda.device_count()
    elif devices == "auto" or devices == -1:
        count = 1
    else:
        count = len(devices)
    return max(1, count) * nodes


def split_batch(global_batch: int, world: int, per_device: int | None = None) -> tuple[int, int]:
    """Global batch is the truth (STYLE 8): per-device x devices (``world``) x accumulation must equal it."""
    per_device = per_device or global_batch // world
    accumulation = global_batch // max(1, per_device * world)
    if per_device < 1 or per_device * world * accumulation != global_batch:
        raise UsageError(
            f"global batch {global_batch} is not per_device_batch_size ({per_device}) x devices ({world}) x "
            f"an integer accumulation; pick speed.per_device_batch_size dividing {global_batch // world}"
        )
    return per_device, accumulation


def resolve_ckpt_path(ckpt_path: str | None, output_dir: Path) -> tuple[str | None, bool]:
    """``last``: this run folder's checkpoints/last.ckpt when it exists (so a killed or preempted run resumes
    by rerunning its command; the folder does not depend on the clock), else a fresh start. A named checkpoint
    (phase 1's, for phase 2) is where the run starts; once this run has its own last.ckpt, rerunning the same
    command continues that instead of starting over. Returns the path and whether it is this run's own (then
    its settings must be this run's)."""
    if ckpt_path in (None, "", "null"):
        return None, False
    own = RunFolder(output_dir).last
    if ckpt_path == "last":
        return (str(own), True) if own.is_file() else (None, False)
    if not Path(ckpt_path).is_file():  # a mistyped path is refused even when the folder has progress
        raise UsageError(f"ckpt_path={ckpt_path} does not exist; expected a Lightning checkpoint (.ckpt) to "
                         "resume, 'last' (this run folder's checkpoints/last.ckpt, when there is one) "
                         "or null")
    if own.is_file() and Path(ckpt_path).resolve() != own.resolve():
        log.info("%s holds this run's progress from an earlier attempt: resuming it, not ckpt_path=%s",
                 own, ckpt_path)
        return str(own), True
    return str(ckpt_path), False


def check_inputs(cfg: DictConfig, output_dir: Path) -> None:
    """Ranges and relations between keys, which the typed configs (config.py) cannot say, and places."""
    optim = cfg.optim
    seed = cfg.get("seed")
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**32:  # numpy's seed range
        raise UsageError(f"seed={seed}: expected a whole number from 0 to 4294967295")
    max_seq, max_position = cfg.data.get("max_seq_length"), cfg.model.get("max_position")
    if max_seq is not None and max_position is not None and max_seq > max_position:
        raise UsageError(f"data.max_seq_length={max_seq} exceeds model.max_position={max_position}: the "
                         "model has no position embedding beyond it; lower data.max_seq_length")
    if optim.get("resume_step") is not None and str(cfg.ckpt_path) in ("last", "None", ""):
        raise UsageError(f"this run continues a schedule at step {optim.resume_step} "
                         "(experiment=pretrain_phase2): pass "
                         "ckpt_path=<phase 1's output dir>/checkpoints/last.ckpt")
    every, keep = cfg.checkpoint.every_n_steps, cfg.checkpoint.keep_recent
    if every is not None and every < 1:
        raise UsageError(f"checkpoint.every_n_steps={every}: expected a positive number of steps, or null")
    if keep < 0:
        raise UsageError(f"checkpoint.keep_recent={keep}: expected 0 or more")
    allreduce = cfg.get("speed", {}).get("grad_allreduce", "fp32")
    if allreduce != "fp32" and cfg.trainer.get("accelerator") not in ("gpu", "cuda"):
        raise UsageError(f"speed.grad_allreduce={allreduce} runs on CUDA GPUs only (torch: "
                         f"\"{BF16_HOOK_NEEDS}\"); leave speed.grad_allreduce=fp32 on "
                         f"trainer.accelerator={cfg.trainer.get('accelerator')}")
    if HydraConfig.initialized():
        hydra_cfg = HydraConfig.get()
        launcher = str(hydra_cfg.launcher.get("_target_", ""))
        if hydra_cfg.mode == RunMode.MULTIRUN and world_size(cfg.trainer) > 1 and "submitit" not in launcher:
            raise SweepUsageError(
                f"a local multirun (-m) with {world_size(cfg.trainer)} devices: Lightning starts each DDP "
                "rank by rerunning the command line, which would start the sweep again inside every job. Run "
                "the sweep with hydra/launcher=submitit_slurm (one SLURM task per device), or its cells one "
                "by one")
    check_writable(output_dir, Path(cfg.paths.cache_dir))


def validate(cfg: DictConfig, output_dir: Path | None = None) -> None:
    """Every value of ``cfg`` checked once, before torch and Lightning load: each key's declared range and the
    shape's relations (config.py, beside the keys), then the relations between nodes and the places
    (``check_inputs``; ``output_dir`` where the run's folder is not there yet, e.g. a table's job). A
    UsageError naming the first key that is wrong."""
    from bert_repro.config import check

    try:
        check(cfg)
    except ValueError as err:
        raise UsageError(str(err)) from None
    check_inputs(cfg, output_dir or Path(cfg.paths.output_dir))


def unwritable(folder: Path) -> str | None:
    """Why ``folder`` cannot be created or written to, in the OS's words (a read-only file system, a full
    disk, no permission, a file in the way); None when it can."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as err:
        return err.strerror
    return None


def check_writable(output_dir: Path, cache_dir: Path) -> None:
    """The two folders a run writes, before any work: a run that cannot write its results has nothing to show,
    and one that cannot write its cache fails at its first tokenization, deep inside the datasets library."""
    for folder, what, key in ((output_dir, "output", "hydra.run.dir=... (or hydra.sweep.dir=... for -m)"),
                              (cache_dir, "cache", "paths.cache_dir=... (or the BERT_REPRO_CACHE variable)")):
        reason = unwritable(folder)
        if reason is not None:
            raise UsageError(f"{what} folder {folder} is not writable ({reason}); choose another with {key}")
