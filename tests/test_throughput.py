"""The MFU every run reports: the peak comes from Lightning's table of known accelerators (the device name
mocked at its boundary, torch.cuda.get_device_name), speed.peak_tflops overrides it, a CPU has none (no
MFU), and a peak the run passes is no ceiling (no MFU either: it never exceeds 1); the FLOPs of a batch are
counted by the Throughput callback from the batch and the module's config."""

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from bert_repro.flops import accelerator_peak_flops, training_flops
from bert_repro.lifecycle import callbacks
from bert_repro.lifecycle.callbacks import Tally, Throughput, compute_dtype
from bert_repro.model import BertConfig

CUDA = torch.device("cuda", 0)


@pytest.mark.parametrize(
    ("name", "tflops"),
    [
        ("NVIDIA H100 80GB HBM3", 989.4),  # H100 SXM
        ("NVIDIA H200", 989.4),  # Lightning's own H200 rows are with sparsity (2000); dense = the H100 SXM's
        ("NVIDIA H200 NVL", 850.0),  # datasheet: 1671 with sparsity
        ("NVIDIA A100-SXM4-80GB", 312.0),
        ("NVIDIA H100 PCIe", 756.0),
    ],
)
def test_peak_of_known_accelerators_from_lightnings_table(monkeypatch, name, tflops):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    peak, source = accelerator_peak_flops(CUDA, torch.bfloat16)
    assert peak == pytest.approx(tflops * 1e12) and "lightning table" in source


def test_unknown_accelerator_has_no_peak(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Some Future GPU")
    with pytest.warns(UserWarning, match="FLOPs not found"):
        assert accelerator_peak_flops(CUDA, torch.bfloat16)[0] is None


def _start(callback: Throughput, precision: str, device: torch.device = CUDA) -> Throughput:
    callback.on_train_start(SimpleNamespace(precision=precision), SimpleNamespace(device=device))
    return callback


def test_throughput_takes_the_table_unless_peak_tflops_overrides(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100-SXM4-80GB")
    table = _start(Throughput(), "bf16-mixed")
    assert table.peak_flops == pytest.approx(312e12) and table.peak_source.startswith("lightning table")
    given = _start(Throughput(peak_tflops=400.0), "bf16-mixed")
    assert given.peak_flops == pytest.approx(400e12) and given.peak_source == "config"
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Some Future GPU")
    with pytest.warns(UserWarning):
        unknown = _start(Throughput(), "bf16-mixed")
    assert unknown.peak_flops is None and unknown.summary()["mfu"] is None
    assert (compute_dtype("bf16-mixed"), compute_dtype("16-mixed"), compute_dtype("32-true")) == (
        torch.bfloat16,
        torch.float16,
        torch.float32,
    )


def _flops(batch: dict, ltr: bool = False, trained: bool = True) -> float:
    """What a Tally counts of ``batch`` through a module of the default BertConfig."""
    bert = torch.nn.Linear(1, 1).requires_grad_(trained)
    module = SimpleNamespace(config=BertConfig(), ltr=ltr, model=SimpleNamespace(bert=bert))
    tally = Tally()
    tally.add(module, batch)
    return tally.read()[1]


def test_a_tally_counts_real_tokens_predictions_and_frozen_encoders():
    config = BertConfig()
    mask = torch.tensor([[1] * 10 + [0] * 6, [1] * 16])  # 26 real tokens in rows of 16
    weights = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])  # 3 real predictions
    pretrain = {"attention_mask": mask, "masked_lm_weights": weights}
    assert _flops(pretrain) == training_flops(config, 26, 16, 3)
    assert _flops(pretrain, ltr=True) == training_flops(config, 26, 16, 9 + 15)
    finetune = {"attention_mask": mask}
    assert _flops(finetune) == training_flops(config, 26, 16, 0)
    assert _flops(finetune, trained=False) == training_flops(config, 26, 16, 0) / 3
    tally = Tally()
    for batch in (pretrain, finetune):  # nothing is read until asked
        tally.add(SimpleNamespace(config=config), batch)
    assert tally.read() == (52, training_flops(config, 26, 16, 3) + training_flops(config, 26, 16, 0))


def test_throughput_counts_every_step_and_logs_on_the_loggers_cadence(tmp_path):
    """Every step after the first is counted; the metrics reach the logger every log_every_n_steps, as
    Lightning's own ThroughputMonitor does, not at every step."""
    import lightning as L
    from lightning.pytorch.loggers import CSVLogger

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            return self.layer(batch["x"]).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])  # 5 real tokens a batch
    batches = [{"x": torch.randn(2, 4), "attention_mask": mask} for _ in range(7)]
    callback = Throughput(peak_tflops=1.0)
    module, steps_logged = Module(), []
    log_dict = module.log_dict
    module.log_dict = lambda metrics, **kw: (steps_logged.append(module.trainer.global_step),
                                             log_dict(metrics, **kw))
    logger = CSVLogger(tmp_path, name="run")
    trainer = L.Trainer(max_steps=7, log_every_n_steps=3, logger=logger, callbacks=[callback],
                        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)
    trainer.fit(module, torch.utils.data.DataLoader(batches, batch_size=None))
    assert callback._tally.read()[0] == 6 * 5 and callback._sequences == 6 * 2  # the first step is warm-up
    assert callback.tokens_per_s > 0
    assert len(steps_logged) == 2, steps_logged  # 2 of the 6 counted steps: every third, not every one
    lines = (Path(logger.log_dir) / "metrics.csv").read_text().splitlines()
    assert "perf/tokens_per_s" in lines[0]


def _steps(callback: Throughput, flops: float, n: int = 3) -> Throughput:
    """``n`` steps of ``flops`` model FLOPs each through the callback, on CPU, the first one warm-up."""
    trainer = SimpleNamespace(world_size=1, _logger_connector=SimpleNamespace(should_update_logs=False),
                              fit_loop=SimpleNamespace(epoch_loop=SimpleNamespace(_is_training_done=False)))
    module = SimpleNamespace(device=torch.device("cpu"), config=BertConfig())
    batch = {"attention_mask": torch.ones(2, 8)}
    for i in range(n):
        callback.on_train_batch_start(trainer, module, batch, i)
        callback.on_train_batch_end(trainer, module, None, batch, i)
    callback.measure()
    return callback


def test_a_cpu_run_reports_no_mfu_unless_given_a_peak(monkeypatch):
    monkeypatch.setattr(callbacks, "training_flops", lambda *counts: 1e6)
    cpu = _steps(_start(Throughput(), "32-true", torch.device("cpu")), 1e6)
    assert cpu.flops_per_s > 0 and cpu.summary()["mfu"] is None and cpu.summary()["peak_source"] is None
    given = _steps(_start(Throughput(peak_tflops=1e6), "32-true", torch.device("cpu")), 1e6)
    assert given.summary()["peak_source"] == "config" and 0 < given.mfu <= 1


def test_mfu_never_exceeds_one_a_peak_the_run_passes_is_no_ceiling(monkeypatch, caplog):
    monkeypatch.setattr(callbacks, "training_flops", lambda *counts: 1e6)
    passed = _steps(_start(Throughput(peak_tflops=1e-12), "32-true", torch.device("cpu")), 1e6)  # 1 FLOP/s
    assert passed.mfu is None and passed.summary()["peak_tflops"] is None
    assert "exceed the peak of 1e-12 (config): MFU is not reported" in caplog.text


@pytest.mark.slow
def test_the_model_summary_shows_no_flops_of_zero(tmp_path):
    """Lightning's summary counts FLOPs only on an example_input_array, which the task modules do not set: our
    summary (lifecycle/trainer.py adds it) keeps the parameters and drops the FLOPs that read 0."""
    import io
    import logging

    import lightning as L
    from lightning.pytorch.callbacks import model_summary

    from bert_repro.lifecycle.callbacks import ModelSummary

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            return self.layer(batch).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    shown = io.StringIO()
    handler = logging.StreamHandler(shown)
    model_summary.log.addHandler(handler)
    try:
        trainer = L.Trainer(max_steps=1, logger=False, callbacks=[ModelSummary()], enable_progress_bar=False,
                            enable_checkpointing=False, default_root_dir=tmp_path)
        trainer.fit(Module(), torch.utils.data.DataLoader(torch.randn(2, 4), batch_size=2))
    finally:
        model_summary.log.removeHandler(handler)
    assert "Total params" in shown.getvalue() and "FLOPs" not in shown.getvalue()
    assert "Flops" not in shown.getvalue() and shown.getvalue().count("Trainable params") == 1


def test_no_step_waits_for_a_read_of_the_device(tmp_path, monkeypatch):
    """The run's callbacks (Throughput, ProgressLines, RunRecord) keep their counts on the device and read
    them (a host sync on a GPU) only at the loggers' cadence and an epoch's last step, not at every step; the
    figures are those of every counted step."""
    import lightning as L

    from bert_repro.lifecycle.callbacks import ProgressLines
    from bert_repro.lifecycle.record import RunRecord

    class Module(L.LightningModule):
        config = BertConfig()

        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            return self.layer(batch["x"]).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])  # 5 real tokens a batch
    weights = torch.tensor([[1.0, 0.0], [1.0, 1.0]])  # 3 predictions
    batches = [{"x": torch.randn(2, 4), "attention_mask": mask, "masked_lm_weights": weights}] * 12
    throughput, record = Throughput(peak_tflops=1.0), RunRecord()
    progress = ProgressLines(every_s=None, every_n_steps=6)
    reads, training = [], L.Callback()  # the steps at which a tensor was read, once training began
    training.on_train_start = lambda trainer, module: reads.append("start")
    trainer = L.Trainer(max_steps=12, log_every_n_steps=6, logger=False, default_root_dir=tmp_path / "r",
                        callbacks=[training, throughput, progress, record], enable_progress_bar=False,
                        enable_model_summary=False, enable_checkpointing=False)
    for name in ("item", "tolist", "__int__", "__float__", "__bool__"):
        read = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name, lambda self, *a, _read=read, **kw: (
            reads and reads.append(trainer.global_step), _read(self, *a, **kw))[1])
    trainer.fit(Module(), torch.utils.data.DataLoader(batches, batch_size=None))
    monkeypatch.undo()
    assert set(reads[1:]) == {6, 12}, sorted(set(reads[1:]))  # the logging steps only
    assert throughput._tally.read()[0] == 11 * 5 and record.totals()["tokens"] == 12 * 5
    assert record.totals()["flops"] == 12 * training_flops(Module.config, 5, 4, 3)
    assert throughput.summary()["tflops_per_device"] > 0 and len(progress.lines) == 3
