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

from bert_repro.flops import accelerator_peak_flops, batch_counts, training_flops
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


class Tally:
    """Real tokens and model FLOPs (flops.training_flops of a task module's BertConfig; 0 without one) of the
    training batches ``add``-ed, counted where the batch lies: ``read`` is the one host sync, so a step on a
    GPU never waits for a count. A frozen encoder runs forward only (1/3 of the FLOPs)."""

    def __init__(self):
        self.tokens, self.flops = 0, 0.0
        self._pending: list[tuple[torch.Tensor, int, object, bool]] = []

    def add(self, pl_module: L.LightningModule, batch: dict) -> None:
        config = getattr(pl_module, "config", None)  # the task modules' BertConfig
        encoder = getattr(getattr(pl_module, "model", None), "bert", None)
        trained = encoder is None or any(p.requires_grad for p in encoder.parameters())
        ltr = bool(getattr(pl_module, "ltr", False))  # the left-to-right LM predicts every next token
        counts = torch.stack(batch_counts(batch, ltr))  # (2,): tokens, predictions
        self._pending.append((counts, batch["attention_mask"].shape[-1], config, trained))

    def read(self) -> tuple[int, float]:
        """The tokens and FLOPs of every batch added so far."""
        if self._pending:
            counts = torch.stack([pending[0] for pending in self._pending]).tolist()
            for (tokens, predictions), (_, seq_len, config, trained) in zip(counts, self._pending):
                self.tokens += tokens
                if config is not None:
                    flops = training_flops(config, tokens, seq_len, predictions)
                    self.flops += flops if trained else flops / 3
            self._pending = []
        return self.tokens, self.flops


def compute_dtype(precision: str) -> torch.dtype:
    """The matmul dtype of a Lightning precision setting ("bf16-mixed", "16-mixed", "32-true" ...)."""
    precision = str(precision)
    if "bf16" in precision:
        return torch.bfloat16
    return torch.float16 if precision.startswith("16") else torch.float32


class Throughput(L.Callback):
    """Real (non-padding) tokens/s, sequences/s and model FLOPs utilisation over the training steps, the
    first ``skip_steps`` excluded (they pay for warm-up, allocation and compilation).

    MFU = the model FLOPs of the steps (a Tally of each batch and the module's BertConfig) per
    second and device, over the accelerator's dense peak: ``peak_tflops`` when given (speed.peak_tflops),
    else Lightning's table of known devices at the run's precision (flops.accelerator_peak_flops). A CPU has
    no such table (its peak depends on the dtype, the threads and what else runs), and an unknown accelerator
    none either: they report no MFU, not a guess. A peak is a ceiling, so MFU never exceeds 1: a run faster
    than the peak it was given reports none, saying why. ``step_s``: the host's time inside every training
    step, warm-up included, of which a run's wall time is a multiple (results.json perf.step_share).
    """

    def __init__(self, skip_steps: int = 1, peak_tflops: float | None = None):
        self.skip_steps = skip_steps
        self.peak_flops = peak_tflops * 1e12 if peak_tflops else None
        self.peak_source = "config" if peak_tflops else None
        self.tokens_per_s: float | None = None
        self.sequences_per_s: float | None = None
        self.flops_per_s: float | None = None  # model FLOP/s of one device
        self.mfu: float | None = None
        self.step_s = 0.0
        self._reset()

    def _reset(self) -> None:
        self._tally, self._sequences, self._batches = Tally(), 0, 0
        self._start: float | None = None
        self._end: float | None = None  # the host's clock at the last counted step's end
        self._world, self._waits = 1, False  # whether _end waits for the device's work
        self.step_s, self._began = 0.0, 0.0

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
        self._began = time.perf_counter()  # after the loader's batch: its wait is not the step's
        if self._start is None and self._batches >= self.skip_steps:
            self._start = self._began

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._batches += 1
        self.step_s += time.perf_counter() - self._began
        if self._start is None:
            return
        self._tally.add(pl_module, batch)
        self._sequences += int(batch["attention_mask"].shape[0])
        self._end = time.perf_counter()
        # every rank sees its own shard of the global batch
        self._world, self._waits = trainer.world_size, pl_module.device.type == "cuda"
        # on the logger's cadence, as Lightning's ThroughputMonitor, and at the last step of an epoch (the
        # run's figures): a read waits for the device, and a self.log every step slows a tiny step
        logging_step = trainer._logger_connector.should_update_logs
        if logging_step or trainer.fit_loop.epoch_loop._is_training_done:
            metrics = self.measure()
            if logging_step and metrics:
                pl_module.log_dict(metrics, on_step=True, on_epoch=False, prog_bar=False)

    def measure(self) -> dict[str, float]:
        """The rates of the steps counted so far, through the last one (the host waits for the device's
        work): what the loggers get as ``perf/*``."""
        if self._start is None or self._end is None:
            return {}
        if self._waits:
            torch.cuda.synchronize()  # the steps' kernels are done before the clock reads
            self._end, self._waits = time.perf_counter(), False
        tokens, flops = self._tally.read()
        elapsed = self._end - self._start
        if elapsed <= 0:
            return {}
        self.tokens_per_s = tokens * self._world / elapsed
        self.sequences_per_s = self._sequences * self._world / elapsed
        metrics = {"perf/tokens_per_s": self.tokens_per_s, "perf/sequences_per_s": self.sequences_per_s}
        if flops:
            self.flops_per_s = flops / elapsed
            metrics["perf/tflops_per_device"] = self.flops_per_s / 1e12
            if self.peak_flops and self.flops_per_s > self.peak_flops:  # not a ceiling: no MFU from it
                log.warning("%.3g model TFLOP/s exceed the peak of %.3g (%s): MFU is not reported",
                            self.flops_per_s / 1e12, self.peak_flops / 1e12, self.peak_source)
                self.peak_flops = self.peak_source = self.mfu = None
            if self.peak_flops:
                self.mfu = self.flops_per_s / self.peak_flops
                metrics["perf/mfu"] = self.mfu
        return metrics

    def summary(self) -> dict:
        """The run's averages, for results.json."""
        return {"tokens_per_s": self.tokens_per_s, "sequences_per_s": self.sequences_per_s,
                "tflops_per_device": self.flops_per_s / 1e12 if self.flops_per_s else None,
                "peak_tflops": self.peak_flops / 1e12 if self.peak_flops else None,
                "peak_source": self.peak_source, "mfu": self.mfu, "step_s": round(self.step_s, 3)}


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
        self._losses: list[torch.Tensor] = []  # read at a line: a read waits for the device

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if loss is not None:
            self._losses.append(loss.detach())
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
            parts.append(f"loss {sum(torch.stack(self._losses).tolist()) / len(self._losses):.4f}")
        self._losses = []
        speed = self._throughput
        if speed:
            speed.measure()
        parts.append(f"tokens/s {speed.tokens_per_s:,.0f}" if speed and speed.tokens_per_s
                     else "tokens/s n/a")
        parts.append(f"MFU {speed.mfu:.1%}" if speed and speed.mfu is not None else "MFU n/a")
        parts.append("done" if done else f"ETA {_duration(eta)}" if eta is not None else "ETA n/a")
        self._say(f"{self.job}: " + " | ".join(parts))

    def _say(self, line: str) -> None:
        if self.active:
            self.lines.append(line)
            log.info("%s", line)
