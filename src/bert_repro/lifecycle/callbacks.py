"""Training-loop measurements that every run records (results.json carries the averages), and what a
finished run keeps of its checkpoints (``retain_checkpoints``), and the progress lines a run prints where no
progress bar draws (``ProgressLines``)."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterable
from fnmatch import fnmatch
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import model_summary as lightning_summary
from lightning.pytorch.utilities.model_summary.model_summary import _format_summary_table

from bert_repro.flops import accelerator_peak_flops, batch_flops
from bert_repro.lifecycle.folder import BEST, LAST, RECENT, RunFolder, step_checkpoint_name, step_of

log = logging.getLogger(__name__)
WEIGHT_BYTES, RESUMABLE_BYTES = 4, 12  # a parameter in fp32; with AdamW's two moments


def unneeded_checkpoints(names: Iterable[str], keep_last: bool, keep_steps: Iterable[int] | None
                         ) -> list[str]:
    """Of the checkpoint file ``names`` a complete run holds, those it no longer needs (conf/train.yaml
    checkpoint:): last.ckpt and recent-*.ckpt unless ``keep_last`` (they are for resuming; never without a
    best.ckpt to stand for the run), and step-<N>.ckpt whose N is not in ``keep_steps`` (None keeps all)."""
    names = sorted(names)
    doomed = []
    if not keep_last and BEST in names:
        doomed += [name for name in names if name == LAST or fnmatch(name, RECENT)]
    if keep_steps is not None:
        keep = {int(step) for step in keep_steps}
        steps = {step: name for name in names if (step := step_of(name)) is not None}
        doomed += [steps[step] for step in sorted(steps) if step not in keep]
    return doomed


def retain_checkpoints(folder: RunFolder, keep_last: bool, keep_steps: Iterable[int] | None) -> list[Path]:
    """A complete run's unneeded_checkpoints deleted from its ``checkpoints/``; returns the deleted files."""
    names = [path.name for path in folder.checkpoints.glob("*.ckpt") if path.is_file()]
    deleted = [folder.checkpoint(name) for name in unneeded_checkpoints(names, keep_last, keep_steps)]
    for path in deleted:
        path.unlink()
    return deleted


def kept_bytes_per_parameter(checkpoint: dict, written: Iterable[int]) -> float:
    """Bytes a parameter of what a complete run keeps under its ``checkpoint:`` config, having written
    best.ckpt, last.ckpt and step-<N>.ckpt at each of ``written``: the plan's disk figure."""
    names = {BEST, LAST, *map(step_checkpoint_name, written)}
    kept = names.difference(unneeded_checkpoints(names, bool(checkpoint.get("keep_last")),
                                                 checkpoint.get("keep_steps")))
    best = WEIGHT_BYTES if checkpoint.get("best_weights_only", True) else RESUMABLE_BYTES
    return best * (BEST in kept) + RESUMABLE_BYTES * len(kept - {BEST})


class StepCheckpoint(L.Callback):
    """A step checkpoint (``RunFolder.step``) every ``every`` optimizer steps, none ever deleted. Not a
    ModelCheckpoint (sub)class: Lightning would let it replace the run's best/last checkpointing."""

    def __init__(self, every: int):
        self.every, self._saved = every, -1

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        # already counts this batch's optimizer step; repeats across accumulated batches
        step = trainer.global_step
        if step > 0 and step % self.every == 0 and step != self._saved:
            self._saved = step
            trainer.save_checkpoint(RunFolder(trainer.default_root_dir).step(step))


def module_batch_flops(pl_module: L.LightningModule, batch: dict) -> float:
    """The training FLOPs of ``batch`` through a task module (flops.batch_flops of its BertConfig); 0 without
    one."""
    config = getattr(pl_module, "config", None)  # the task modules' BertConfig
    if config is None:
        return 0.0
    encoder = getattr(getattr(pl_module, "model", None), "bert", None)
    trained = encoder is None or any(p.requires_grad for p in encoder.parameters())
    ltr = bool(getattr(pl_module, "ltr", False))  # the left-to-right LM predicts every next token
    return batch_flops(config, batch, ltr=ltr, trained=trained)


def compute_dtype(precision: str) -> torch.dtype:
    """The matmul dtype of a Lightning precision setting ("bf16-mixed", "16-mixed", "32-true" ...)."""
    precision = str(precision)
    if "bf16" in precision:
        return torch.bfloat16
    return torch.float16 if precision.startswith("16") else torch.float32


class Throughput(L.Callback):
    """Real (non-padding) tokens/s, sequences/s and model FLOPs utilisation over the training steps, the
    first ``skip_steps`` excluded (they pay for warm-up, allocation and compilation).

    MFU = the model FLOPs of the steps (flops.batch_flops of each batch and the module's BertConfig) per
    second and device, over the accelerator's dense peak: ``peak_tflops`` when given (speed.peak_tflops),
    else Lightning's table of known devices at the run's precision (flops.accelerator_peak_flops). A CPU has
    no such table (its peak depends on the dtype, the threads and what else runs), and an unknown accelerator
    none either: they report no MFU, not a guess. A peak is a ceiling, so MFU never exceeds 1: a run faster
    than the peak it was given reports none, saying why.
    """

    def __init__(self, skip_steps: int = 1, peak_tflops: float | None = None):
        self.skip_steps = skip_steps
        self.peak_flops = peak_tflops * 1e12 if peak_tflops else None
        self.peak_source = "config" if peak_tflops else None
        self.tokens_per_s: float | None = None
        self.sequences_per_s: float | None = None
        self.flops_per_s: float | None = None  # model FLOP/s of one device
        self.mfu: float | None = None
        self._reset()

    def _reset(self) -> None:
        self._tokens = self._sequences = self._batches = 0
        self._flops = 0.0
        self._start: float | None = None

    def on_train_start(self, trainer, pl_module) -> None:
        self._reset()
        device = pl_module.device
        if self.peak_flops is None and device.type == "cuda":
            dtype = compute_dtype(trainer.precision)
            self.peak_flops, self.peak_source = accelerator_peak_flops(device, dtype)
        if self.peak_flops is None:
            log.log(logging.INFO if device.type == "cpu" else logging.WARNING,
                    "no known peak for %s and no speed.peak_tflops: MFU is not reported", device)
            self.peak_source = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self._start is None and self._batches >= self.skip_steps:
            self._start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._batches += 1
        if self._start is None:
            return
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize()  # the step's kernels are done before the clock reads
        mask = batch["attention_mask"]
        self._tokens += int(mask.sum())
        self._sequences += int(mask.shape[0])
        self._flops += module_batch_flops(pl_module, batch)
        elapsed = time.perf_counter() - self._start
        if elapsed <= 0:
            return
        world = trainer.world_size  # every rank sees its own shard of the global batch
        self.tokens_per_s = self._tokens * world / elapsed
        self.sequences_per_s = self._sequences * world / elapsed
        metrics = {"perf/tokens_per_s": self.tokens_per_s, "perf/sequences_per_s": self.sequences_per_s}
        if self._flops:
            self.flops_per_s = self._flops / elapsed
            metrics["perf/tflops_per_device"] = self.flops_per_s / 1e12
            if self.peak_flops and self.flops_per_s > self.peak_flops:  # not a ceiling: no MFU from it
                log.warning("%.3g model TFLOP/s exceed the peak of %.3g (%s): MFU is not reported",
                            self.flops_per_s / 1e12, self.peak_flops / 1e12, self.peak_source)
                self.peak_flops = self.peak_source = self.mfu = None
            if self.peak_flops:
                self.mfu = self.flops_per_s / self.peak_flops
                metrics["perf/mfu"] = self.mfu
        # on the logger's cadence, as Lightning's ThroughputMonitor: a self.log every step slows a tiny step
        if trainer._logger_connector.should_update_logs:
            pl_module.log_dict(metrics, on_step=True, on_epoch=False, prog_bar=False)

    def summary(self) -> dict:
        """The run's averages, for results.json."""
        return {"tokens_per_s": self.tokens_per_s, "sequences_per_s": self.sequences_per_s,
                "tflops_per_device": self.flops_per_s / 1e12 if self.flops_per_s else None,
                "peak_tflops": self.peak_flops / 1e12 if self.peak_flops else None,
                "peak_source": self.peak_source, "mfu": self.mfu}


class ModelSummary(lightning_summary.ModelSummary):
    """Lightning's summary table less its FLOPs (the column and the "Total Flops" line): Lightning counts one
    forward pass on a module's ``example_input_array``, which ours do not set, so they read 0. Throughput
    counts the training FLOPs."""

    @staticmethod
    def summarize(summary_data, total_parameters, trainable_parameters, model_size, total_training_modes,
                  total_flops, **summarize_kwargs) -> None:
        table = _format_summary_table(total_parameters, trainable_parameters, model_size,
                                      total_training_modes, total_flops,
                                      *(column for column in summary_data if column[0] != "FLOPs"))
        kept = "\n".join(line for line in table.splitlines() if not line.endswith("Total Flops"))
        lightning_summary.log.info("\n" + kept)  # where Lightning's own summary goes


def _duration(seconds: float) -> str:
    minutes, s = divmod(int(seconds), 60)
    hours, m = divmod(minutes, 60)
    return f"{hours}h{m:02d}m" if hours else f"{m}m{s:02d}s"


class ProgressLines(L.Callback):
    """Plain log lines where no progress bar draws (SLURM, nohup, a pipe, the table runner's launch.log, or
    trainer.enable_progress_bar=false), every ``every_s`` seconds or ``every_n_steps`` optimizer steps: the
    job, step, epoch, mean loss since the last line, tokens/s and MFU (the Throughput callback's) and the ETA
    of this attempt's pace; a line per Dev evaluation, and one at the end. On a terminal the bar shows them.
    ETA goes to the loggers too (``progress/eta_s``, beside Throughput's ``perf/*`` and the module's loss).
    ``validated_step``: the step of the last Dev evaluation (run.py does not evaluate the same weights again).
    """

    def __init__(self, every_s: float | None = 20.0, every_n_steps: int | None = None):
        if not every_s and not every_n_steps:
            raise ValueError("ProgressLines: give every_s (seconds) or every_n_steps (optimizer steps)")
        self.every_s, self.every_n_steps = every_s, every_n_steps
        self.validated_step: int | None = None
        self.lines: list[str] = []  # what was printed, in order (tests read it)

    def setup(self, trainer, pl_module, stage: str) -> None:
        bar = trainer.progress_bar_callback
        self.active = trainer.is_global_zero and (bar is None or not sys.stdout.isatty())
        if self.active and bar is not None:  # off a terminal a bar writes control codes, not lines
            bar.disable()
        root = Path(trainer.default_root_dir)
        self.job = f"{root.parent.name}/{root.name}"  # the task (or sweep) and the run folder

    def on_train_start(self, trainer, pl_module) -> None:
        self._throughput = next((c for c in trainer.callbacks if isinstance(c, Throughput)), None)
        self._began, self._first_step = time.monotonic(), trainer.global_step
        self._last_time, self._last_step = self._began, trainer.global_step
        self._loss, self._losses = 0.0, 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if loss is not None:
            self._loss, self._losses = self._loss + float(loss), self._losses + 1
        step, now = trainer.global_step, time.monotonic()
        if step == self._last_step:  # mid-accumulation: no optimizer step yet
            return
        eta = self._eta(trainer, now)
        if eta is not None and trainer._logger_connector.should_update_logs:  # Throughput's cadence
            pl_module.log("progress/eta_s", eta, on_step=True, on_epoch=False)
        due = (self.every_n_steps and step % self.every_n_steps == 0) or (
            self.every_s and now - self._last_time >= self.every_s)
        if due:
            self._print(trainer, eta)
            self._last_time, self._last_step = now, step

    def on_validation_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking or trainer.state.fn != "fit":
            return
        self.validated_step = trainer.global_step
        dev = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/")}
        self._say(f"{self.job}: Dev at step {trainer.global_step}: "
                  + " ".join(f"{k} {v:.4f}" for k, v in sorted(dev.items())))

    def on_train_end(self, trainer, pl_module) -> None:
        self._print(trainer, 0.0, done=True)

    def _eta(self, trainer, now: float) -> float | None:
        total, done = trainer.estimated_stepping_batches, trainer.global_step - self._first_step
        if done <= 0 or total == float("inf"):
            return None
        return max(0.0, (now - self._began) / done * (total - trainer.global_step))

    def _print(self, trainer, eta: float | None, done: bool = False) -> None:
        total = trainer.estimated_stepping_batches
        epochs = f"/{trainer.max_epochs}" if trainer.max_epochs and trainer.max_epochs > 0 else ""
        parts = [f"step {trainer.global_step}" + (f"/{total}" if total != float("inf") else ""),
                 f"epoch {trainer.current_epoch + (0 if done else 1)}{epochs}"]
        if self._losses:
            parts.append(f"loss {self._loss / self._losses:.4f}")
        self._loss, self._losses = 0.0, 0
        speed = self._throughput
        parts.append(f"tokens/s {speed.tokens_per_s:,.0f}" if speed and speed.tokens_per_s
                     else "tokens/s n/a")
        parts.append(f"MFU {speed.mfu:.1%}" if speed and speed.mfu is not None else "MFU n/a")
        parts.append("done" if done else f"ETA {_duration(eta)}" if eta is not None else "ETA n/a")
        self._say(f"{self.job}: " + " | ".join(parts))

    def _say(self, line: str) -> None:
        if self.active:
            self.lines.append(line)
            log.info("%s", line)
