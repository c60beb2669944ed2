"""Instance creation on real text: MB/s of raw text per process beside google-research/bert's, the scaling
with num_proc, and peak heap against corpus size (a benchmark script, not a test: STYLE 12).

    python -m bert_repro.benchmarks.instances      # books at 1x, 4x, 16x, 64x; 1 and 2 processes at each
    python -m bert_repro.benchmarks.instances --num-proc 1 2 4 --copies 1 4 --dupe-factor 5 --wikitext
    python -m bert_repro.benchmarks.instances --copies 1 4 --num-proc 1 2 --repeats 3   # best of 3, not 2

The reference: google-research/bert's create_pretraining_data.py (TF 2, compat.v1, one process) on the shared
Gutenberg books (dupe_factor 1, max_seq_length 128, max_predictions 20, bert-base-uncased vocabulary),
tokenization included; its rate is in docs/benchmarks.md. The corpus here is the same books of the shared data
folder, one document per chapter (`--wikitext` adds the WikiText-2 articles), written once in the original
format; the larger sizes repeat it (`--copies`), so only the amount of text changes. Each size runs with each
`--num-proc` (one process always). Each configuration runs in a fresh child process
with an empty cache and a fixed vocabulary (WordPiece training is not what is measured), through
PretrainDataModule.setup: reading the text into Arrow, the train/val split, tokenization, and instance
creation with static masking (`dupe_factor` rounds). Meanwhile a thread samples the proportional set size
(PSS, from /proc/<pid>/smaps_rollup) of the child and its worker processes, so memory shared after fork is not
counted twice (read every 0.5 s, with the RSS growth since every 20 ms: PSS is slow to read, so sampling it
every 20 ms took a large share of a core). The sampler's CPU time is left out of the figures
(`sampler_cpu_s`). "anon" is the heap (Python objects, Arrow buffers being built); the rest is file-backed
pages of the memory-mapped Arrow cache, which the kernel reclaims at will. Peak heap must not grow with the
corpus.
One JSON line per configuration (with the 1-minute load average when it started, and `others_cores`: the
cores other processes held during the run, from /proc/stat less the run's own CPU time), then a summary
naming the CPU model and the load (`uptime`), per size the scaling num_proc=N / num_proc=1 of wall MB/s (the
target: >= 0.8 N) and of MB per CPU-second, and last the scaling at the largest size: a map gives each
process at least `pretraining.PROCESS_BYTES` (8 MB) or runs in one process, so at 1x (less train text than
that) num_proc=2 runs as one process, and the pool's fixed cost a map weighs least at the largest
size. The machine may be shared, so each line also gives MB per CPU-second of the setup, workers included
(`cpu_mb_per_s`), which other processes' load disturbs less than wall time: on a machine with no other load,
wall scaling is N x the CPU-second ratio at best; other jobs holding cores understate both (with one core
held, num_proc=2 also spent a quarter more CPU time a MB: three processes sharing two cores).
`--repeats K` (default 2) runs each configuration K times, the num_proc settings of a size taking turns, and
keeps the fastest (wall): a machine's speed drifts between repeats minutes apart (docs/benchmarks.md).
`--no-memory` leaves the memory sampler out (its PSS readings, per process every 0.5 s, take kernel time
from the workers on a small shared machine).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

# run from the repository root, as the README does: the shared data sits beside it
SHARED = Path(os.environ.get("BERT_REPRO_SHARED_DATA") or "../shared/data")
MB = 1 << 20
REFERENCE_MB_PER_S = 8.5 / 17.5  # google-research/bert, one process (see above)


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


def _rss(pid: int) -> tuple[int, int]:
    """(RSS, anonymous RSS) of one process in bytes, from /proc/<pid>/status: cheap to read, where
    smaps_rollup (PSS) costs far more kernel time in a process with torch loaded."""
    try:
        fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    except (OSError, ValueError):
        return 0, 0
    return (int(fields.get("VmRSS", "0 kB").split()[0]) * 1024,
            int(fields.get("RssAnon", "0 kB").split()[0]) * 1024)


class PeakMemory:
    """Peaks of the PSS of this process and its descendants, and the sizes at the start (`baseline`,
    `baseline_anon`). PSS costs far more kernel time to read than RSS: so it reads PSS every
    `pss_interval` seconds (and for each new process) and RSS every `interval`, and takes each process's PSS
    at its last reading plus its RSS growth since as its PSS in between (new pages are private: they count the
    same in both). `cpu`: the sampler's own CPU seconds, which the benchmark leaves out of the figures."""

    def __init__(self, interval: float = 0.02, pss_interval: float = 0.5):
        self.interval, self.pss_interval = interval, pss_interval
        self.peak, self.peak_anon, self.cpu = 0, 0, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        last, then = -self.pss_interval, {}  # then: pid -> (PSS, RSS) at the last PSS reading
        while True:
            stopping = self._stop.is_set()
            rss = {pid: _rss(pid) for pid in _tree(os.getpid())}
            # PSS afresh at the interval, at the end, and for a new process (a forked worker's RSS counts the
            # pages it shares with its parent)
            if stopping or rss.keys() - then.keys() or time.perf_counter() - last >= self.pss_interval:
                last, then = time.perf_counter(), {pid: (_pss(pid), rss[pid]) for pid in rss}
            now = [sum(then[pid][0][i] + rss[pid][i] - then[pid][1][i] for pid in rss) for i in (0, 1)]
            self.peak, self.peak_anon = max(self.peak, now[0]), max(self.peak_anon, now[1])
            if stopping:
                break
            self._stop.wait(self.interval)
        self.cpu = time.thread_time()

    def __enter__(self) -> PeakMemory:
        self.baseline, self.baseline_anon = (sum(s[i] for s in map(_pss, _tree(os.getpid()))) for i in (0, 1))
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


class NoMemory:
    """PeakMemory's figures, all zero, and no sampler (`--no-memory`): its PSS readings cost CPU time that
    a shared 2-core machine takes from the workers."""

    peak = peak_anon = baseline = baseline_anon = 0
    cpu = 0.0

    def __enter__(self) -> NoMemory:
        return self

    def __exit__(self, *exc) -> None:
        pass


def write_corpus(text_dir: Path, out: Path, copies: int, wikitext: bool = False) -> Path:
    """The shared Gutenberg books (and the WikiText-2 articles with ``wikitext``) in the original format,
    `copies` times over."""
    from bert_repro.data.corpus import gutenberg_documents, wikitext_documents

    base = out.with_name("corpus-1x.txt")
    if not base.is_file():
        from bert_repro.data.corpus import write_documents

        sources = [gutenberg_documents(text_dir / "gutenberg")]
        if wikitext:
            sources.insert(0, wikitext_documents(text_dir / "wikitext-2-raw" / "wiki.test.raw"))
        write_documents((d for source in sources for d in source), base)
    out.write_text(base.read_text(encoding="utf-8") * copies, encoding="utf-8")
    return out


def _busy_seconds() -> float:
    """CPU seconds all processes of the machine have used since boot (/proc/stat: user to steal, not idle or
    iowait)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    user, nice, system, _, _, irq, softirq, steal = fields[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _cpu_seconds() -> float:
    """CPU seconds of this process and its finished children (the num_proc workers)."""
    own, children = (resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def child(args: dict) -> dict:
    """One configuration, in this (fresh) process: the DataModule's setup under the memory sampler."""
    import logging

    from bert_repro.data.pretraining import PretrainDataModule

    logging.getLogger("datasets").setLevel(logging.ERROR)
    import datasets
    from datasets import Dataset

    datasets.disable_progress_bars()
    start, cpu_start = time.perf_counter(), _cpu_seconds()
    with (PeakMemory() if args.get("memory", True) else NoMemory()) as memory:
        dm = PretrainDataModule(args["corpus"], tokenizer=args["vocab"],
                                max_seq_length=args["max_seq_length"], masking="static",
                                max_predictions_per_seq=args.get("max_predictions", 20),
                                dupe_factor=args["dupe_factor"], num_proc=args["num_proc"],
                                cache_dir=args["cache_dir"], seed=12345)
        dm.setup()
    total, cpu = time.perf_counter() - start, _cpu_seconds() - cpu_start - memory.cpu
    baseline, baseline_anon = memory.baseline, memory.baseline_anon
    train = dm.instance_stats["train"]
    cache = Path(args["cache_dir"])
    tokens = sum(len(chunk.values.values) for path in (cache / "pretrain").glob("tokens-*.arrow")
                 for chunk in Dataset.from_file(str(path)).data.column("tokens").chunks)
    sizes = {kind: sum(p.stat().st_size for p in cache.rglob(f"{kind}*.arrow"))
             for kind in ("corpus", "tokens", "instances")}
    return {
        "tokens": tokens, "text_cache_bytes": sizes["corpus"] + sizes["tokens"],
        "instance_bytes": sizes["instances"],
        "corpus_copies": args["copies"], "num_proc": args["num_proc"], "dupe_factor": args["dupe_factor"],
        "max_seq_length": args["max_seq_length"], "documents": train["documents"],
        "instances": train["instances"],
        "corpus_mb": round(Path(args["corpus"]).stat().st_size / MB, 2),
        "mb_per_s": round(Path(args["corpus"]).stat().st_size / MB / total, 3),  # text in -> instances out
        "cpu_mb_per_s": round(Path(args["corpus"]).stat().st_size / MB / cpu, 3),
        "documents_per_s": round(train["documents"] / train["instances_s"], 1),
        "instances_per_s": round(train["instances"] / train["instances_s"], 1),
        "tokenize_s": round(train["tokenize_s"], 2), "instances_s": round(train["instances_s"], 2),
        "setup_s": round(total, 2), "cpu_s": round(cpu, 2), "sampler_cpu_s": round(memory.cpu, 2),
        "baseline_pss_mb": round(baseline / MB, 1), "peak_pss_mb": round(memory.peak / MB, 1),
        "baseline_anon_mb": round(baseline_anon / MB, 1), "peak_anon_mb": round(memory.peak_anon / MB, 1),
        "peak_anon_increase_mb": round((memory.peak_anon - baseline_anon) / MB, 1),
        "process_cpu_s": round(_cpu_seconds(), 2),  # since the child started, imports included
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bert_repro.benchmarks.instances",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--text", type=Path, default=SHARED / "pretrain_text",
                        help="the shared pre-training text folder")
    parser.add_argument("--num-proc", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--copies", type=int, nargs="+", default=[1, 4, 16, 64],
                        help="corpus sizes, in copies of the text (64x: 520 MB, and about 3 GB of caches)")
    parser.add_argument("--dupe-factor", type=int, default=1)
    parser.add_argument("--max-seq-length", type=int, default=128)
    parser.add_argument("--max-predictions", type=int, default=20, help="80 at 512 tokens (v2 A.2)")
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--wikitext", action="store_true", help="add the WikiText-2 articles to the books")
    parser.add_argument("--no-memory", action="store_true",
                        help="no memory sampler (its readings take CPU time from the runs): speed only")
    parser.add_argument("--repeats", type=int, default=2,
                        help="runs of each configuration, taking turns; the fastest is kept (the machine is "
                             "noisy)")
    parser.add_argument("--rates", action="store_true",
                        help="write the plan's data rates (the slowest one-process run) to tables.plan.RATES")
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
        corpora = {c: write_corpus(args.text, tmp / f"corpus-{c}x-copies.txt", c, args.wikitext)
                   for c in sorted(set(args.copies))}
        docs = load_documents(str(corpora[min(corpora)]), cache_dir=tmp / "vocab-cache")
        texts = (s for batch in docs.iter(batch_size=256) for d in batch["sentences"] for s in d)
        vocab = str(save_vocab(train_wordpiece(texts, args.vocab_size), tmp / "vocab"))
        num_procs = [1] + sorted(set(args.num_proc) - {1})
        best = {}
        # the num_proc settings of a size take turns, repeat by repeat: a drift in the machine's speed (a
        # neighbour's load, the clock) falls on each alike, not on the scaling
        for copies, repeat, num_proc in itertools.product(corpora, range(args.repeats), num_procs):
            run = {"corpus": str(corpora[copies]), "vocab": vocab, "copies": copies, "num_proc": num_proc,
                   "dupe_factor": args.dupe_factor, "max_seq_length": args.max_seq_length,
                   "max_predictions": args.max_predictions,
                   "cache_dir": str(tmp / f"cache-{copies}-{num_proc}-{repeat}"),
                   "memory": not args.no_memory}
            load, busy, start = os.getloadavg()[0], _busy_seconds(), time.perf_counter()
            proc = subprocess.run([sys.executable, "-m", "bert_repro.benchmarks.instances", "--child",
                                   json.dumps(run)],
                                  capture_output=True, text=True,
                                  env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
            if proc.returncode != 0:
                raise SystemExit(f"error: the run {run} failed:\n{proc.stderr[-3000:]}")
            busy, wall = _busy_seconds() - busy, time.perf_counter() - start
            shutil.rmtree(run["cache_dir"], ignore_errors=True)  # gigabytes at 64x: disk and writeback
            result = json.loads(proc.stdout.strip().splitlines()[-1])
            # the cores other processes held meanwhile (the machine's busy time less the child's own)
            others = max(0.0, busy - result["process_cpu_s"]) / wall
            result.update(load_1min=round(load, 2), others_cores=round(others, 2))
            print(json.dumps(result), flush=True)
            if (copies, num_proc) not in best or result["mb_per_s"] > best[copies, num_proc]["mb_per_s"]:
                best[copies, num_proc] = result
        results = list(best.values())  # by size, then num_proc
        print(summary(results), flush=True)
        if args.rates:
            print(f"wrote {write_rates(results, argv)}")


def write_rates(results: list[dict], argv: list[str] | None) -> Path:
    """tables.plan.RATES: per CPU-second, the corpus's tokens read and tokenized, a round of instances'
    tokens (the slowest one-process run; its CPU time shared out by wall time), and the caches' bytes a token
    by length; with the machine, the date and the command. A run at another --max-seq-length adds its
    length."""
    from datetime import datetime, timezone

    from bert_repro.tables.plan import RATES

    one = [r for r in results if r["num_proc"] == 1]
    slowest = min(one, key=lambda r: r["mb_per_s"])
    old = json.loads(RATES.read_text()) if RATES.is_file() else {}
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), "unknown CPU")
    tokens = slowest["tokens"]
    per_round = slowest["instance_bytes"] / tokens / slowest["dupe_factor"]
    busy = slowest["cpu_s"] / slowest["setup_s"]  # CPU-seconds: a shared machine's wait is not the work's
    record = {"machine": f"{cpu}, {os.cpu_count()} cores, load {slowest.get('load_1min')}",
              "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
              "command": " ".join(["python -m bert_repro.benchmarks.instances", *(argv or sys.argv[1:])]),
              "text_tokens_per_s": round(tokens / (slowest["tokenize_s"] * busy)),
              "round_tokens_per_s": round(tokens * slowest["dupe_factor"] / (slowest["instances_s"] * busy)),
              "text_cache_bytes_per_token": round(slowest["text_cache_bytes"] / tokens, 2),
              "instance_bytes_per_token": {**old.get("instance_bytes_per_token", {}),
                                           str(slowest["max_seq_length"]): round(per_round, 2)}}
    RATES.parent.mkdir(parents=True, exist_ok=True)
    RATES.write_text(json.dumps(record, indent=2) + "\n")
    return RATES


def summary(results: list[dict]) -> str:
    """The three figures, with the machine they were measured on: per size, the scaling num_proc=N
    over 1, and last, on a line of its own, the scaling at the largest size (what a real corpus sees)."""
    from bert_repro.data.pretraining import PROCESS_BYTES

    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), "unknown CPU")
    one = {r["corpus_copies"]: r for r in results if r["num_proc"] == 1}
    first = one[min(one)]
    loads = [r["load_1min"] for r in results if "load_1min" in r]
    others = [r["others_cores"] for r in results if "others_cores" in r]
    lines = [f"CPU: {cpu}, {os.cpu_count()} cores; load average (1 min) {min(loads, default=0):.2f}-"
             f"{max(loads, default=0):.2f} at the runs' starts, {os.getloadavg()[0]:.2f} at the end; other "
             f"processes held {min(others, default=0):.2f}-{max(others, default=0):.2f} cores in the runs",
             f"one process, {first['corpus_mb']} MB: {first['mb_per_s']} MB/s of raw text "
             f"({first['mb_per_s'] / REFERENCE_MB_PER_S:.1f}x google-research/bert's "
             f"{REFERENCE_MB_PER_S:.2f} MB/s; target 10x), {first['cpu_mb_per_s']} MB per CPU-second"]
    scaling = {}
    for r in results:
        base, n = one[r["corpus_copies"]], r["num_proc"]
        line = (f"{r['corpus_copies']}x ({r['corpus_mb']} MB), num_proc={n}: {r['mb_per_s']} MB/s wall, "
                f"{r['cpu_mb_per_s']} MB per CPU-second, others held {r.get('others_cores', 0):.2f} cores")
        if n > 1:
            wall, per_cpu = r["mb_per_s"] / base["mb_per_s"], r["cpu_mb_per_s"] / base["cpu_mb_per_s"]
            scaling[r["corpus_copies"], n] = wall, per_cpu
            line += (f"; scaling num_proc={n}/1: wall {wall:.2f}x (target >= {0.8 * n:.1f}), per CPU-second "
                     f"{per_cpu:.2f}x (1.0: no work added)")
            # a map gives each process PROCESS_BYTES at least (corpus.pool_size): the train split is 95%
            if r["corpus_mb"] * MB * 0.95 < 2 * PROCESS_BYTES:
                line += f" [under {2 * PROCESS_BYTES // MB} MB of train text: every map ran in one process]"
        lines.append(line)
    if any(r["peak_pss_mb"] for r in results):
        lines.append("peak heap (anon PSS above the baseline): " + ", ".join(
            f"{c}x {r['peak_anon_increase_mb']} MB" for c, r in sorted(one.items())))
    largest = max(one)
    for (copies, n), (wall, per_cpu) in sorted(scaling.items()):
        if copies == largest:
            lines.append(f"SCALING at the largest size, {largest}x ({one[largest]['corpus_mb']} MB): "
                         f"num_proc={n} gives {wall:.2f}x one process's MB/s (target >= {0.8 * n:.1f}), "
                         f"{per_cpu:.2f}x its MB per CPU-second")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
