"""Padding benchmark on real MRPC (or SST-2, --task sst2): dynamic padding vs the released code's fixed 128
tokens.

    python -m bert_repro.benchmarks.padding --init /ckpt/bert-base-uncased --glue-dir ../shared/data/glue

Fine-tunes the same checkpoint once per padding mode, with the same seed and so the same batches in the
same order, and prints per mode: the tokens the encoder processes per epoch (padding included), the
training step time, and the dev accuracy / F1 reached. Target: dynamic padding processes at most 45% of
the fixed-padding tokens at equal dev accuracy. A script, not a test (STYLE 12).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import lightning as L

from bert_repro.convert.loaders import load_checkpoint
from bert_repro.data.glue import GlueDataModule
from bert_repro.tasks.classification import SequenceClassificationModule
from bert_repro.tokenization import save_vocab, tokenizer_from_vocab

MODES = {"dynamic": dict(padding="longest"), "fixed-128": dict(padding="max_length"),
         "dynamic+grouped": dict(padding="longest", group_by_length=True)}


class StepTimer(L.Callback):
    """Wall time of each training step (forward, backward, optimizer)."""

    def __init__(self):
        self.times, self._start = [], 0.0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.times.append(time.perf_counter() - self._start)

    def median_ms(self, skip: int = 3) -> float:  # the first steps pay for warm-up and allocation
        return 1000 * statistics.median(self.times[skip:] if len(self.times) > skip else self.times)


def run_mode(name: str, args: argparse.Namespace, loaded, vocab_file: Path) -> dict:
    L.seed_everything(args.seed, workers=True)
    # SST-2's dev size; the shared copy has no dev.tsv
    extra = {"dev_from_train": 872} if args.task == "sst2" else {}
    data = GlueDataModule(args.task, glue_dir=str(args.glue_dir), tokenizer=str(vocab_file),
                          lowercase=bool(loaded.lowercase), batch_size=args.batch_size, seed=args.seed,
                          cache_dir=str(args.cache_dir), max_train_examples=args.max_train_examples,
                          **MODES[name], **extra)
    model = {**loaded.config.to_dict(), "vocab_size": len(loaded.vocab)}
    optim = dict(lr=args.lr, betas=[0.9, 0.999], eps=1e-6, weight_decay=0.01, warmup_steps=None,
                 warmup_ratio=0.1)
    module = SequenceClassificationModule(model, optim, task=args.task, num_labels=2,
                                          speed={"fast_kernels": True})
    module.load_pretrained(loaded)
    timer = StepTimer()
    trainer = L.Trainer(accelerator=args.accelerator, devices=1, precision=args.precision,
                        max_epochs=args.epochs, gradient_clip_val=1.0, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0, callbacks=[timer])
    start = time.perf_counter()
    trainer.fit(module, datamodule=data)
    seconds = time.perf_counter() - start
    dev = {k: float(v)
           for d in trainer.validate(module, datamodule=data, verbose=False) for k, v in d.items()}
    first = module.history[0]
    return {"mode": name, "processed": first["train/real_tokens"] + first["train/padded_tokens"],
            "real": first["train/real_tokens"], "step_ms": timer.median_ms(),
            "train_s": seconds, "acc": dev["val/acc"], "f1": dev.get("val/f1", float("nan")),
            "examples": len(data.datasets["train"])}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bert_repro.benchmarks.padding",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--init", required=True,
                        help="checkpoint: our .ckpt, an HF directory or a TF checkpoint")
    parser.add_argument("--task", choices=("mrpc", "sst2"), default="mrpc")
    parser.add_argument("--glue-dir", type=Path, default=Path("../shared/data/glue"))
    parser.add_argument("--cache-dir", type=Path, default=Path(".cache/glue"))
    parser.add_argument("--modes", nargs="+", default=["dynamic", "fixed-128"], choices=list(MODES))
    parser.add_argument("--epochs", type=int, default=3, help="§4.1: 3")
    parser.add_argument("--batch-size", type=int, default=32, help="§4.1: 32")
    parser.add_argument("--lr", type=float, default=2e-5)
    parser.add_argument("--seed", type=int, default=12345)
    parser.add_argument("--max-train-examples", type=int, help="a train subset, for a quick look")
    parser.add_argument("--accelerator", default="auto")
    parser.add_argument("--precision", default="32-true")
    args = parser.parse_args(argv)
    loaded = load_checkpoint(args.init)
    if loaded.vocab is None:
        raise SystemExit(f"{args.init} carries no vocabulary")
    args.cache_dir.mkdir(parents=True, exist_ok=True)
    vocab_file = save_vocab(tokenizer_from_vocab(loaded.vocab, bool(loaded.lowercase)),
                            args.cache_dir / "bench_vocab.txt")
    rows = [run_mode(name, args, loaded, vocab_file) for name in args.modes]
    fixed = next((r for r in rows if r["mode"] == "fixed-128"), rows[0])
    print(f"\n{args.task.upper()} train ({rows[0]['examples']} examples), batch {args.batch_size}, "
          f"{args.epochs} epoch(s), lr {args.lr}, {args.init}")
    print(f"{'mode':<16}{'tokens/epoch':>14}{'vs fixed':>10}{'real share':>12}{'ms/step':>10}{'vs fixed':>10}"
          f"{'train s':>10}{'dev acc':>9}{'dev F1':>8}")
    for r in rows:
        print(f"{r['mode']:<16}{r['processed']:>14,}{r['processed'] / fixed['processed']:>10.1%}"
              f"{r['real'] / r['processed']:>12.1%}{r['step_ms']:>10.1f}"
              f"{r['step_ms'] / fixed['step_ms']:>10.2f}"
              f"{r['train_s']:>10.1f}{r['acc']:>9.4f}{r['f1']:>8.4f}")


if __name__ == "__main__":
    main()
