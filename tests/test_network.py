"""Every network call has a deadline and a named failure: against a server on 127.0.0.1 that accepts and
never answers, and a port that refuses (HF_ENDPOINT pointed at each), every way the platform reaches the Hub
(init=<Hub id>, a fine-tuning task's Hub data set, a pre-training corpus on the Hub, streamed or not, and
convert push-to-hub) ends within seconds of its deadline, naming what it reached, where, the deadline and how
to do without the network; no traceback."""

import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from bert_repro.network import NotCached

from .conftest import REPO, run_py

# seconds: each case must end within a few of them; short, as every case waits it out once or twice
DEADLINE = 0.5
# the code each command runs to reach the Hub, called as the command calls it (TMP: the case's own folder):
# what it imports (not timed), then the call
REACHES = {
    "init": ("from bert_repro.lifecycle.pretrained import fetch", "fetch('someone/bert-x')"),
    "glue": ("from bert_repro.data.base import hub_split",
             "hub_split({'path': 'nyu-mll/glue', 'name': 'rte'}, 'train', TMP, 'data.glue_dir')"),
    "conll": ("from bert_repro.data.base import hub_split",
              "hub_split({'path': 'eriktks/conll2003', 'revision': 'refs/convert/parquet'}, 'validation', "
              "TMP, 'data.conll_dir')"),
    "corpus": ("from bert_repro.data.hub import load_hub_documents",
               "load_hub_documents([{'path': 'wikimedia/wikipedia', 'name': '20231101.en', "
               "'format': 'wiki'}], TMP)"),
    "streamed corpus": ("from bert_repro.data.hub import load_hub_documents",
                        "load_hub_documents([{'path': 'bookcorpus/bookcorpus', 'streaming': True, "
                        "'format': 'sentences'}], TMP)"),
    "push": ("from bert_repro.convert.card import push_to_hub", "push_to_hub(EXPORT, 'me/bert-x')"),
}
NAMES = {"init": "init=someone/bert-x", "glue": "the Hub data set nyu-mll/glue (rte)",
         "conll": "the Hub data set eriktks/conll2003", "corpus": "data.hub entry 'wikimedia/wikipedia'",
         "streamed corpus": "data.hub entry 'bookcorpus/bookcorpus'", "push": "the upload of"}
OFFLINE = {"init": "hf download someone/bert-x", "glue": "data.glue_dir=", "conll": "data.conll_dir=",
           "corpus": "data.source=files", "streamed corpus": "data.source=files",
           "push": "is kept: push it again"}
# one process runs every case (the imports once): each case's seconds and what it raised
RUNNER = """
import json, pathlib, sys, time, traceback
from bert_repro.network import Unreachable, set_deadline
set_deadline(float(sys.argv[1]))
root, said = pathlib.Path(sys.argv[2]), {}
EXPORT = root / "export"
EXPORT.mkdir(parents=True)
(EXPORT / "config.json").write_text("{}")
(EXPORT / "README.md").write_text("a model card")
for i, (case, (imports, call)) in enumerate(json.loads(sys.argv[3]).items()):
    TMP = root / str(i)
    exec(imports)
    began = time.monotonic()
    try:
        exec(call)
        outcome = "no error"
    except Unreachable as err:
        outcome = str(err)
    except Exception:
        outcome = traceback.format_exc()
    said[case] = [time.monotonic() - began, outcome]
print(json.dumps(said))
"""


def _hub_env(endpoint: str, home) -> dict[str, str]:
    """This process's environment with the Hub at ``endpoint``, online, with an empty cache."""
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")}
    return {**env, "HF_ENDPOINT": endpoint, "HF_HOME": str(home), "HF_TOKEN": "hf_not_a_token",
            "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def silent():
    """http://127.0.0.1:<port> of a server that accepts every connection and never answers."""
    server = socket.create_server(("127.0.0.1", 0))
    held, stop = [], threading.Event()

    def accept():
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join()
    for connection in held:
        connection.close()
    server.close()


@pytest.fixture(scope="module")
def refusing():
    """http://127.0.0.1:<port> of a port nothing listens on: a connection is refused at once."""
    with socket.create_server(("127.0.0.1", 0)) as probe:
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module", params=["silent", "refusing"])
def reached(request, tmp_path_factory):
    """(endpoint kind, {case: [seconds, message]}) of every case against that endpoint."""
    endpoint = request.getfixturevalue(request.param)
    root = tmp_path_factory.mktemp(request.param)
    proc = subprocess.run([sys.executable, "-c", RUNNER, str(DEADLINE), str(root / "cases"),
                           json.dumps(REACHES)], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env=_hub_env(endpoint, root / "hf"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return request.param, endpoint, json.loads(proc.stdout.splitlines()[-1])


@pytest.mark.parametrize("case", list(REACHES))
@pytest.mark.slow
def test_every_way_to_the_hub_ends_within_its_deadline_named(reached, case):
    kind, endpoint, said = reached
    seconds, message = said[case]
    assert NAMES[case] in message and endpoint in message, message
    why = (f"got no answer from {endpoint} within {DEADLINE} s (network.timeout_s={DEADLINE})"
           if kind == "silent" else f"cannot connect to {endpoint} ([Errno 111] Connection refused)")
    assert why in message and OFFLINE[case] in message, message
    # an upload needs the Hub: no offline way
    assert (case == "push") != ("HF_HUB_OFFLINE=1 reads local files" in message), message
    # a deadline for the telemetry look-up before the first call, one for the call; a refused connection is
    # retried (huggingface_hub sleeps 1 s, then 2 s) until the deadline has passed
    assert seconds < 2 * DEADLINE + 4, (seconds, message)


@pytest.mark.slow
def test_a_run_whose_init_hub_is_silent_exits_69_within_its_deadline(silent, tmp_path, monkeypatch):
    """network.timeout_s reaches the run: init=<Hub id> against the silent server."""
    for key, value in _hub_env(silent, tmp_path / "hf").items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    began = time.monotonic()
    proc = run_py("task=rte", "init=someone/bert-x", f"network.timeout_s={DEADLINE}", "logger=none",
                  f"paths.cache_dir={tmp_path / 'cache'}", f"hydra.run.dir={tmp_path / 'run'}",
                  new_process=True, timeout=300)
    said = proc.stdout + proc.stderr
    assert proc.returncode == 69, said[-3000:]
    assert f"init=someone/bert-x got no answer from {silent} within {DEADLINE} s" in said, said[-3000:]
    assert "Traceback" not in said
    assert time.monotonic() - began < 120  # the imports on a busy machine; unbounded, it never ends


@pytest.mark.slow
def test_push_to_hub_names_the_silent_hub_and_keeps_the_export(silent, tmp_path):
    export = tmp_path / "export"
    export.mkdir()
    (export / "config.json").write_text("{}")
    (export / "README.md").write_text("a model card")
    command = ["push-to-hub", str(export), "me/bert-x", "--timeout", str(DEADLINE)]
    proc = subprocess.run([sys.executable, "-m", "bert_repro.convert", *command], cwd=REPO, text=True,
                          capture_output=True, timeout=300, env=_hub_env(silent, tmp_path / "hf"))
    said = proc.stdout + proc.stderr
    assert proc.returncode == 69, said[-3000:]
    assert f"got no answer from {silent} within {DEADLINE} s (--timeout={DEADLINE})" in said, said
    assert "Traceback" not in said
    assert sorted(p.name for p in export.iterdir()) == ["README.md", "config.json"]


def test_offline_with_nothing_cached_names_the_key_of_local_files(tmp_path):
    """HF_HUB_OFFLINE=1 (as every test runs) and a task's Hub data set not cached: a wrong input, the key that
    reads the task's files named, not the datasets library's ConnectionError."""
    from bert_repro.data.base import hub_split

    assert os.environ["HF_HUB_OFFLINE"] == "1"
    said = (r"the Hub data set nyu-mll/glue \(rte\) is not in the Hugging Face cache and HF_HUB_OFFLINE is "
            r"set; give the task's files with data.glue_dir=")
    with pytest.raises(NotCached, match=said):
        hub_split({"path": "nyu-mll/glue", "name": "rte"}, "train", tmp_path, "data.glue_dir")
