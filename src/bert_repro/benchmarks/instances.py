"""Instance creation on real text: documents/s, instances/s and peak memory, for 1 and 2 processes and two
corpus sizes (a benchmark script, not a test: STYLE 12).

    python -m bert_repro.benchmarks.instances                  # ../shared/data/pretrain_text, sizes 1x and 3x
    python -m bert_repro.benchmarks.instances --num-proc 1 2 4 --copies 1 2 4 --dupe-factor 5

The corpus is the real pre-training text of the shared data folder (WikiText-2 articles, text passages only,
and the Gutenberg books, one document per chapter), written once in the original format; the larger sizes
repeat it (`--copies`), so only the amount of text changes. Each configuration runs in a fresh child process
with an empty cache and a fixed vocabulary (WordPiece training is not what is measured), through
PretrainDataModule.setup: reading the text into Arrow, the train/val split, tokenization, and instance
creation with static masking (`dupe_factor` rounds). Meanwhile a thread samples the proportional set size
(PSS, from /proc/<pid>/smaps_rollup) of the child and its worker processes, so memory shared after fork is not
counted twice. "anon" is the heap (Python objects, Arrow buffers being built); the rest is file-backed pages
of the memory-mapped Arrow cache, which the kernel reclaims at will. Peak heap must not grow with the corpus.
One JSON line per configuration.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

# run from the repository root, as the README does: the shared data sits beside it
SHARED = Path(os.environ.get("BERT_REPRO_SHARED_DATA") or "../shared/data")
MB = 1 << 20


def _pss(pid: int) -> tuple[int, int]:
    """(PSS, anonymous PSS) of one process in bytes; (0, 0) once it has gone."""
    try:
        fields = dict(line.split(":", 1)
                      for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:])
    except (OSError, ValueError):
        return 0, 0
    kb = {k: int(v.split()[0]) for k, v in fields.items() if v.strip().endswith("kB")}
    return kb.get("Pss", 0) * 1024, kb.get("Pss_Anon", 0) * 1024


def _tree(pid: int) -> list[int]:
    pids, todo = [], [pid]
    while todo:
        p = todo.pop()
        pids.append(p)
        for task in Path(f"/proc/{p}/task").glob("*/children"):
            try:
                todo += [int(c) for c in task.read_text().split()]
            except OSError:
                pass
    return pids


class PeakMemory:
    """Samples the PSS of this process and its descendants every `interval` seconds; keeps the peaks."""

    def __init__(self, interval: float = 0.02):
        self.interval, self.peak, self.peak_anon = interval, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            sizes = [_pss(p) for p in _tree(os.getpid())]
            self.peak = max(self.peak, sum(s[0] for s in sizes))
            self.peak_anon = max(self.peak_anon, sum(s[1] for s in sizes))
            self._stop.wait(self.interval)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def write_corpus(text_dir: Path, out: Path, copies: int, books_only: bool = False) -> Path:
    """The shared pre-training text in the original format, `copies` times over (the Gutenberg books
    alone with ``books_only``: the BooksCorpus stand-in)."""
    from bert_repro.data.corpus import gutenberg_documents, wikitext_documents

    base = out.with_name("corpus-1x.txt")
    if not base.is_file():
        from bert_repro.data.corpus import write_documents

        sources = [gutenberg_documents(text_dir / "gutenberg")]
        if not books_only:
            sources.insert(0, wikitext_documents(text_dir / "wikitext-2-raw" / "wiki.test.raw"))
        write_documents((d for source in sources for d in source), base)
    out.write_text(base.read_text(encoding="utf-8") * copies, encoding="utf-8")
    return out


def child(args: dict) -> dict:
    """One configuration, in this (fresh) process: the DataModule's setup under the memory sampler."""
    import logging

    from bert_repro.data.pretraining import PretrainDataModule

    logging.getLogger("datasets").setLevel(logging.ERROR)
    import datasets

    datasets.disable_progress_bars()
    baseline, baseline_anon = (sum(s[i] for s in map(_pss, _tree(os.getpid()))) for i in (0, 1))
    start = time.perf_counter()
    with PeakMemory() as memory:
        dm = PretrainDataModule(args["corpus"], tokenizer=args["vocab"],
                                max_seq_length=args["max_seq_length"], masking="static",
                                dupe_factor=args["dupe_factor"], num_proc=args["num_proc"],
                                cache_dir=args["cache_dir"], seed=12345)
        dm.setup()
    total = time.perf_counter() - start
    train = dm.instance_stats["train"]
    return {
        "corpus_copies": args["copies"], "num_proc": args["num_proc"], "dupe_factor": args["dupe_factor"],
        "max_seq_length": args["max_seq_length"], "documents": train["documents"],
        "instances": train["instances"],
        "corpus_mb": round(Path(args["corpus"]).stat().st_size / MB, 2),
        "mb_per_s": round(Path(args["corpus"]).stat().st_size / MB / total, 3),  # text in -> instances out
        "documents_per_s": round(train["documents"] / train["instances_s"], 1),
        "instances_per_s": round(train["instances"] / train["instances_s"], 1),
        "tokenize_s": round(train["tokenize_s"], 2), "instances_s": round(train["instances_s"], 2),
        "setup_s": round(total, 2),
        "baseline_pss_mb": round(baseline / MB, 1), "peak_pss_mb": round(memory.peak / MB, 1),
        "baseline_anon_mb": round(baseline_anon / MB, 1), "peak_anon_mb": round(memory.peak_anon / MB, 1),
        "peak_anon_increase_mb": round((memory.peak_anon - baseline_anon) / MB, 1),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bert_repro.benchmarks.instances",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--text", type=Path, default=SHARED / "pretrain_text",
                        help="the shared pre-training text folder")
    parser.add_argument("--num-proc", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--copies", type=int, nargs="+", default=[1, 3],
                        help="corpus sizes, in copies of the text")
    parser.add_argument("--dupe-factor", type=int, default=1)
    parser.add_argument("--max-seq-length", type=int, default=128)
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--books-only", action="store_true",
                        help="the Gutenberg books alone (BooksCorpus's stand-in)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(json.loads(args.child))), flush=True)
        return
    if not (args.text / "wikitext-2-raw").is_dir() or not (args.text / "gutenberg").is_dir():
        raise SystemExit(f"error: {args.text} lacks wikitext-2-raw/ and gutenberg/; point --text at "
                         "../shared/data/pretrain_text (or set BERT_REPRO_SHARED_DATA)")
    from bert_repro.data.corpus import load_documents
    from bert_repro.tokenization import save_vocab, train_wordpiece

    with tempfile.TemporaryDirectory(prefix="bench_instances-") as tmp:
        tmp = Path(tmp)
        corpora = {c: write_corpus(args.text, tmp / f"corpus-{c}x-copies.txt", c, args.books_only)
                   for c in sorted(set(args.copies))}
        docs = load_documents(str(corpora[min(corpora)]), cache_dir=tmp / "vocab-cache")
        texts = (s for batch in docs.iter(batch_size=256) for d in batch["sentences"] for s in d)
        vocab = str(save_vocab(train_wordpiece(texts, args.vocab_size), tmp / "vocab"))
        for copies, corpus in corpora.items():
            for num_proc in args.num_proc:
                run = {"corpus": str(corpus), "vocab": vocab, "copies": copies, "num_proc": num_proc,
                       "dupe_factor": args.dupe_factor, "max_seq_length": args.max_seq_length,
                       "cache_dir": str(tmp / f"cache-{copies}-{num_proc}")}
                proc = subprocess.run([sys.executable, "-m", "bert_repro.benchmarks.instances", "--child",
                                       json.dumps(run)],
                                      capture_output=True, text=True, env={**os.environ,
                                                                           "TOKENIZERS_PARALLELISM": "false"})
                if proc.returncode != 0:
                    raise SystemExit(f"error: the run {run} failed:\n{proc.stderr[-3000:]}")
                print(proc.stdout.strip().splitlines()[-1], flush=True)


if __name__ == "__main__":
    main()
