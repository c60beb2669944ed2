"""A catalogue of wrong inputs, each run as a user runs it (src/train.py, python -m bert_repro.selection, the
table runner behind `make tableN`) beside an earlier good run: each must exit non-zero with a short message
that names the input and what was expected, no Python traceback, and leave the earlier results.json and
checkpoints as they were. A run into the good run's own folder with other settings is refused by the folder
(its result is other science); the others run in a folder of their own, as their command would."""

import gzip
import json

import pytest

from .conftest import COMMON, FAST, fingerprint, run_py

GLUE = ["task=rte", "optim.epochs=1", "data.max_train_examples=16"]

# (id, arguments (FILES/ROOT/... substituted), module, or a script under src/, or None for src/train.py, parts
# the message must contain)
CASES = [
    ("unknown-task", ["task=nope"], None, ["task/nope", "Available options"]),
    ("unknown-model", ["model=huge"], None, ["model/huge", "Available options"]),
    ("unknown-ablation", ["ablation=nope"], None, ["ablation/nope", "Available options"]),
    ("unknown-scale", ["scale=galactic"], None, ["scale/galactic", "Available options"]),
    ("misspelled-key", ["optim.lrr=1e-4"], None, ["optim.lrr", "did you mean 'optim.lr'"]),
    ("unparsable-override", ["task=rte", "setup=[export A=1]"], None, ["no viable alternative at input"]),
    ("heads-do-not-divide-hidden", ["model.num_heads=3"], None, ["hidden_size", "num_heads"]),
    ("max-seq-length-above-max-position", ["scale.pretrain.max_seq_length=1024"], None,
     ["data.max_seq_length=1024 exceeds model.max_position=512"]),
    ("missing-glue-folder", [*GLUE, "data.tokenizer=FILES/vocab.txt", "data.glue_dir=/nonexistent/glue"],
     None, ["/nonexistent/glue/RTE/train.tsv does not exist"]),
    ("glue-file-wrong-columns", [*GLUE, "data.tokenizer=FILES/vocab.txt",
                                 "data.files.train=FILES/wrong_columns.tsv",
                                 "data.files.dev=FILES/wrong_columns.tsv"], None,
     ["wrong_columns.tsv: no column", "sentence1", "its columns are"]),
    ("glue-released-checkpoint-offline", [*GLUE], None,  # no init=: the released one, not cached offline
     ["is not in the Hugging Face cache", "hf download", "pass init="]),
    ("squad-answer-outside-context",
     ["task=squad_v1", "data.tokenizer=FILES/vocab.txt", "data.squad_dir=FILES/squad_bad"], None,
     ["question q1: answer 'far away' at answer_start 500 lies outside its"]),
    ("conll-malformed-line",
     ["task=conll2003", "data.tokenizer=FILES/vocab.txt", "data.conll_dir=FILES/conll_bad"], None,
     ["eng.train line 4: 2 column(s), expected 4"]),
    ("glue-file-not-utf8", [*GLUE, "data.tokenizer=FILES/vocab.txt", "data.files.train=FILES/latin1.tsv",
                            "data.files.dev=FILES/latin1.tsv"], None,
     ["latin1.tsv line 3: byte 0xe9 is not UTF-8", "iconv"]),
    ("compressed-corpus", ["data.corpus=FILES/corpus.txt.gz"], None,
     ["corpus.txt.gz is gzip-compressed, not text; decompress it first"]),
    ("missing-corpus", ["data.corpus=/nonexistent/corpus.txt"], None, ["/nonexistent/corpus.txt"]),
    ("empty-corpus", ["data.corpus=FILES/empty.txt"], None, ["empty.txt"]),
    ("vocabulary-checkpoint-mismatch",
     ["init=ROOT/good/checkpoints/last.ckpt", "data.tokenizer=FILES/small_vocab.txt"], None,
     ["last.ckpt has a vocabulary of", "the run's tokenizer has 500"]),
    ("truncated-checkpoint", ["init=FILES/truncated.ckpt"], None,
     ["truncated.ckpt: not a readable bert_repro Lightning checkpoint with torch.load(weights_only=True)"]),
    ("garbage-checkpoint", ["init=FILES/garbage.ckpt"], None, ["garbage.ckpt"]),
    ("hf-directory-without-weights", ["init=FILES/hf_no_weights"], None,
     ["hf_no_weights: no weights; expected model.safetensors or pytorch_model.bin"]),
    ("init-path-does-not-exist", ["init=/nonexistent/bert.ckpt"], None, ["/nonexistent/bert.ckpt"]),
    ("zero-learning-rate", ["optim.lr=0"], None, ["optim.lr=0: expected a positive number"]),
    ("negative-learning-rate", ["optim.lr=-1e-4"], None, ["optim.lr=-0.0001: expected a positive number"]),
    ("zero-batch-size", ["data.batch_size=0"], None, ["data.batch_size=0: expected a positive number"]),
    ("zero-epochs", [*GLUE, "data.tokenizer=FILES/vocab.txt", "optim.epochs=0"], None,
     ["optim.epochs=0: expected a positive whole number of epochs"]),
    ("negative-max-steps", ["optim.max_steps=-5"], None,
     ["optim.max_steps=-5: expected a positive number of steps"]),
    ("negative-scale-steps", ["experiment=pretrain_phase1", "scale.pretrain.max_steps=-1000"], None,
     ["optim.schedule_steps=-1000 (from ${scale.pretrain.max_steps}): expected a positive whole number"]),
    ("resume-checkpoint-does-not-exist", ["ckpt_path=/nonexistent/last.ckpt"], None,
     ["ckpt_path=/nonexistent/last.ckpt does not exist"]),
    ("folder-holds-a-result-of-other-settings", ["optim.lr=1e-3", "hydra.run.dir=ROOT/good"], None,
     ["ROOT/good holds the finished result of other settings (optim.lr: was 0.0005, now 0.001)",
      "it is left as it is"]),
    ("folder-holds-another-tasks-result",
     [*GLUE, "data.tokenizer=FILES/vocab.txt", "hydra.run.dir=ROOT/good"], None,
     ["ROOT/good holds the finished result of other settings", "it is left as it is"]),
    ("output-folder-not-writable", ["hydra.run.dir=FILES/a_file/run"], None,
     ["output folder FILES/a_file/run cannot be written (Not a directory); "
      "choose another with hydra.run.dir="]),
    ("collect-malformed-results", ["ROOT/collect"], "bert_repro.selection",
     ["ROOT/collect/run0/results.json is not a results.json as src/train.py writes it",
      "expected JSON with"]),
    ("collect-folder-does-not-exist", ["ROOT/nowhere"], "bert_repro.selection",
     ["ROOT/nowhere is not a folder of runs"]),
    # what `make table5 SCALE=galactic` runs (make would first reinstall the package when pyproject.toml
    # changed)
    ("table-at-unknown-scale", ["run", "table5", "--scale", "galactic", "--runs-dir", "ROOT/tables"],
     "bert_repro.tables", ["argument --scale: 'galactic': expected one of smoke, budget, paper"]),
    # every option checked at parse time with its range, as the config keys are
    ("collapse-share-above-one", ["ROOT/collect", "--collapse", "1.5"], "bert_repro.selection",
     ["argument --collapse: '1.5': expected a share of the Dev predictions in (0, 1]"]),
    ("collapse-share-negative", ["ROOT/collect", "--collapse=-0.5"], "bert_repro.selection",
     ["argument --collapse: '-0.5': expected a share of the Dev predictions in (0, 1]"]),
    ("table-no-gpus", ["plan", "table5", "--gpus", "0", "--runs-dir", "ROOT/tables"], "bert_repro.tables",
     ["argument --gpus: '0': expected a positive number of GPUs (4) or distinct CUDA device numbers"]),
    ("table-set-without-a-value", ["plan", "table5", "--set", "grid.seed", "--runs-dir", "ROOT/tables"],
     "bert_repro.tables", ["argument --set: 'grid.seed': expected KEY=VALUE"]),
    ("unknown-table", ["plan", "table55", "--runs-dir", "ROOT/tables"], "bert_repro.tables",
     ["argument table: 'table55': expected one of table1,"]),
    ("convert-tolerance-negative", ["check", "ROOT/good/checkpoints/last.ckpt", "--tol=-1"],
     "bert_repro.convert", ["argument --tol: '-1': expected a tolerance of 0 or more"]),
    # degenerate data: blank texts, files with no rows, a vocabulary that repeats a token
    ("squad-blank-context-and-answer",
     ["task=squad_v1", "data.tokenizer=FILES/vocab.txt", "data.squad_dir=FILES/squad_blank"], None,
     ["FILES/squad_blank/train-v1.1.json: question q1: its context is '   '; expected text"]),
    ("glue-header-only-train", [*GLUE, "data.tokenizer=FILES/vocab.txt", "data.files.dev=FILES/rte.tsv",
                                "data.files.train=FILES/header_only.tsv"], None,
     ["FILES/header_only.tsv: no rows after the header line; expected at least one example"]),
    ("vocabulary-repeats-a-token", [*GLUE, "data.tokenizer=FILES/repeated_vocab.txt"], None,
     ["FILES/repeated_vocab.txt line ", "repeats line 11; expected each WordPiece token on one line only"]),
    ("warmup-ratio-out-of-range", ["optim.warmup_ratio=5"], None,
     ["optim.warmup_ratio=5: expected a fraction in [0, 1]"]),
    # messages that name what the user typed
    ("group-misspelled", ["modle=tiny"], None, ["unknown group or key 'modle' (did you mean 'model='?)"]),
    ("unquoted-non-ascii-path", ["data.corpus=/tmp/café.txt"], None,
     ["the override grammar does not take é unquoted; quote the value", "'data.corpus=\"/tmp/café.txt\"'"]),
    ("negative-seed", ["seed=-1"], None, ["seed=-1: expected a whole number from 0 to 4294967295"]),
    ("group-set-to-null", ["logger=null"], None, ["logger=null: a group is left out with '~logger'"]),
    # a checkpoint is what it is (identity.py): another task's is not resumed as this one's
    ("resume-another-tasks-checkpoint", [*GLUE, "data.tokenizer=FILES/vocab.txt", "hydra.run.dir=ROOT/rte",
                                         "ckpt_path=ROOT/good/checkpoints/last.ckpt"],
     None, ["ckpt_path=ROOT/good/checkpoints/last.ckpt is a checkpoint of task=pretrain, not of this run's "
            "task=rte (labels entailment, not_entailment)"]),
    # nothing overwritten without being asked: an export into the good run's own folder
    ("export-into-a-folder-with-files", ["to-hf", "ROOT/good/checkpoints/last.ckpt", "ROOT/good"],
     "bert_repro.convert", ["ROOT/good is not empty", "--force"]),
    # messages that point the right way: evaluation reads the Dev file alone, init= is named as given
    ("evaluate-without-the-dev-file", ["task=rte", "init=ROOT/good/checkpoints/last.ckpt",
                                       "data.glue_dir=/nonexistent/glue"], "evaluate.py",
     ["task=rte split dev: /nonexistent/glue/RTE/dev.tsv does not exist"]),
    ("init-export-without-vocabulary", [*GLUE, "init=FILES/hf_no_vocab"], None,
     ["init=FILES/hf_no_vocab has no vocabulary (no FILES/hf_no_vocab/vocab.txt)", "data.tokenizer="]),
    ("network-deadline-not-positive", ["network.timeout_s=0"], None,
     ["network.timeout_s=0: expected a positive number of seconds"]),
]


@pytest.mark.parametrize("args,module,parts", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_fails_clearly_and_leaves_earlier_results(good, args, module, parts):
    tmp, out, cache, files = good
    before = fingerprint(out)

    def fill(text: str) -> str:
        return text.replace("FILES", str(files)).replace("ROOT", str(tmp))

    args = [fill(a) for a in args]
    module, script = (None, module) if module and module.endswith(".py") else (module, "train.py")
    if module is None:
        glue = any(a.startswith("task=") for a in args)
        args = [*(COMMON if glue else FAST), f"paths.cache_dir={cache}", *args]
        if not any(a.startswith("hydra.run.dir=") for a in args):
            args.append(f"hydra.run.dir={tmp / 'cases' / str(abs(hash(tuple(args))))}")  # a folder of its own
    proc = run_py(*args, module=module, script=script)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output[-3000:]
    for part in parts:
        assert fill(part) in output, output[-3000:]
    assert "Traceback (most recent call last)" not in output, output[-3000:]
    assert fingerprint(out) == before  # the earlier run's results and checkpoints are untouched


def test_the_catalogue_covers_the_required_inputs():
    assert len(CASES) >= 46


def test_evaluate_reads_the_dev_file_alone(good):
    """An evaluation of a task whose train file is nowhere (data.glue_dir) needs its Dev file only."""
    tmp, out, cache, files = good
    run = tmp / "evaluate-dev-only"
    init = out / "checkpoints" / "last.ckpt"
    proc = run_py(*COMMON, f"paths.cache_dir={cache}", "task=rte", f"init={init}",
                  "data.glue_dir=/nonexistent/glue", f"data.files.dev={files / 'rte.tsv'}",
                  f"hydra.run.dir={run}", script="evaluate.py")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert json.loads((run / "results.json").read_text())["data_sizes"] == {"dev": 2}


# The task readers on bad bytes and malformed rows, in process (the catalogue runs two of them end to end).
@pytest.mark.parametrize("reader", ["glue", "swag", "squad", "conll"])
def test_task_files_with_bad_bytes_name_the_file_and_line(tmp_path, reader):
    from bert_repro.data.conll import read_conll
    from bert_repro.data.squad import read_squad_json
    from bert_repro.data.tabular import FileSpec, read_rows

    good = {"glue": b"index\tsentence\tlabel\n0\tfine\t1\n1\tfine too\t0\n",
            "swag": b"sent1,sent2,ending0,label\na,b,c,0\nd,e,f,1\n",
            "squad": b'{"version": "1.1",\n "data": [\n{"title": "t", "paragraphs": []}]}\n',
            "conll": b"-DOCSTART- -X- O O\n\nEU NNP B-NP B-ORG\nrejects VBZ B-VP O\n"}[reader]
    lines = good.split(b"\n")
    lines[2] = lines[2][:1] + b"\xe9" + lines[2][1:]  # one Latin-1 byte on line 3
    path = tmp_path / f"bad.{reader}"
    path.write_bytes(b"\n".join(lines))
    read = {"glue": lambda: read_rows(FileSpec(str(path), format="tsv"), tmp_path / "cache"),
            "swag": lambda: read_rows(FileSpec(str(path), format="csv"), tmp_path / "cache"),
            "squad": lambda: read_squad_json(path, version=1),
            "conll": lambda: read_conll(path)}[reader]
    with pytest.raises(ValueError, match=f"{path} line 3: byte 0xe9 is not UTF-8"):
        read()
    path.write_bytes(gzip.compress(good))
    with pytest.raises(ValueError, match=f"{path} is gzip-compressed, not text"):
        read()


def test_malformed_rows_name_the_file_and_line(tmp_path):
    from bert_repro.data.squad import read_squad_json
    from bert_repro.data.tabular import FileSpec, read_rows

    (tmp_path / "short.csv").write_text("sent1,sent2,ending0,label\na,b,c,0\nd,e\n")
    with pytest.raises(ValueError, match="short.csv line 3: 2 fields, expected 4"):
        read_rows(FileSpec(str(tmp_path / "short.csv")), tmp_path / "cache")
    (tmp_path / "huge.csv").write_text("a,b,label\nx," + "y" * 200_000 + ",1\n")  # past csv's field limit
    with pytest.raises(ValueError, match=r"huge.csv line 2: not a readable row \(field larger than"):
        read_rows(FileSpec(str(tmp_path / "huge.csv")), tmp_path / "cache")
    (tmp_path / "cut.json").write_text('{"version": "1.1",\n "data": [\n{"title": "t", "paragr')
    with pytest.raises(ValueError, match=r"cut.json is not a SQuAD file .*line 3"):
        read_squad_json(tmp_path / "cut.json", version=1)
