"""The reference in docs/ (and the README) stays true to the code: every command in a code block is composed,
parsed or made (tests/test_readme.py's checks), every config key and module the prose names is looked up, the
architecture page lists every module of the tree, and extending.md's task of one's own composes and reads its
files as written. A renamed key, module or file fails here, naming the page and the name."""

import ast
import importlib
import importlib.util
import io
import json
import re
import tokenize
from functools import cache
from pathlib import Path

import pytest
import yaml
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import OmegaConf

from .conftest import REPO, run_py
from .test_readme import check_line, commands
from .test_run_names import hydra_config

DOCS = sorted((REPO / "docs").glob("*.md"))
PAGES = [REPO / "README.md", *DOCS]
PACKAGE = REPO / "src" / "bert_repro"
# the config nodes a dotted name in backticks may belong to (hydra.* depends on the launcher: not looked up)
ROOTS = ("data", "optim", "model", "speed", "trainer", "task", "scale", "checkpoint", "callbacks", "paths",
         "ablation", "module", "logger", "init", "seed", "ckpt_path", "test")
# composed configs whose keys together are every key the docs may name: each task family, the DDP trainer
VARIANTS = [["task=mrpc"], ["task=mnli"], ["task=pretrain"], ["task=squad_v1"], ["task=conll2003"],
            ["task=swag"],
            ["task=mrpc", "trainer=ddp"], ["task=pretrain", "scale=paper"]]
FILE_SUFFIXES = ("py", "yaml", "json", "md", "tsv", "csv", "txt", "ckpt", "jsonl", "png", "pdf", "zip")
# keys a page defines in its own YAML (not in conf/): the page, and why
OWN_KEYS = {"task.own": "extending.md: a task of one's own, its YAML block"}


def page_id(path: Path) -> str:
    return str(path.relative_to(REPO))


def prose(path: Path) -> str:
    """The page's text outside its code blocks."""
    return re.sub(r"^```.*?^```", "", path.read_text(), flags=re.M | re.S)


def backticked(path: Path) -> list[str]:
    return re.findall(r"`([^`\n]+)`", prose(path))


@cache
def composed_keys() -> frozenset[str]:
    keys = set()
    for overrides in VARIANTS:
        cfg = OmegaConf.to_container(hydra_config(overrides), resolve=False)
        cfg.pop("hydra", None)
        stack = [("", cfg)]
        while stack:
            prefix, node = stack.pop()
            for key, value in node.items():
                keys.add(f"{prefix}{key}")
                if isinstance(value, dict):
                    stack.append((f"{prefix}{key}.", value))
    return frozenset(keys)


def named_keys(path: Path) -> list[str]:
    """Dotted config keys named in backticks (`optim.lr`, `+data.max_eval_examples=64`), the value cut."""
    found = []
    for text in backticked(path):
        for word in text.split():
            key = word.split("=")[0].rstrip(".,;:)")
            bare = key.lstrip("+")
            if (not re.fullmatch(r"[a-z_][a-z0-9_]*(\.[a-z0-9_]+)+", bare) or bare.split(".")[0] not in ROOTS
                    or bare.rsplit(".", 1)[1] in FILE_SUFFIXES):
                continue
            found.append(key)
    return found


def source_text() -> str:
    return "\n".join(p.read_text() for p in PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("page", DOCS, ids=page_id)
@pytest.mark.slow
def test_every_command_in_docs_is_current(page, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("REVIEWS", str(write_own_task(tmp_path)))  # extending.md: my_conf/ by its commands
    monkeypatch.chdir(tmp_path)
    stale = []
    for line in commands(page):
        try:
            check_line(line, capsys)
        except BaseException as err:  # noqa: BLE001 (Hydra's and SystemExit alike: the line is named)
            said = str(err).splitlines()[0] if str(err) else ""
            stale.append(f"{line}\n    -> {type(err).__name__}: {said}")
    assert not stale, f"stale commands in {page_id(page)}:\n" + "\n".join(stale)


@pytest.mark.parametrize("page", PAGES, ids=page_id)
@pytest.mark.slow
def test_every_config_key_named_exists(page):
    """A plain key is in a composed config; a `+key` is in none (Hydra refuses `+` on an existing key) and the
    package still reads its last part."""
    keys, code = composed_keys(), source_text()
    wrong = []
    for key in named_keys(page):
        bare = key.lstrip("+")
        if bare in OWN_KEYS:
            continue
        if key.startswith("+"):
            if bare in keys or not re.search(rf"\b{re.escape(bare.split('.')[-1])}\b", code):
                wrong.append(f"{key}: in a composed config already, or read nowhere in src/bert_repro")
        elif bare not in keys:
            wrong.append(f"{key}: in no composed config ({', '.join(' '.join(v) for v in VARIANTS)})")
    assert not wrong, f"{page_id(page)} names keys that do not exist:\n" + "\n".join(wrong)


def resolves(name: str) -> bool:
    """A file path (from the repository, src/ or the package) or a dotted module / attribute exists."""
    if "/" in name or name.endswith((".py", ".yaml", ".md", ".ipynb")):
        path = name.split("#")[0].rstrip("/")
        return any((base / path).exists() for base in (REPO, REPO / "src", PACKAGE, REPO / "docs"))
    parts = name.split(".")
    for cut in range(len(parts), 1, -1):
        module = ".".join(parts[:cut])
        try:
            if importlib.util.find_spec(module) is None:
                continue
        except ModuleNotFoundError:  # a name below a module that is no package: an attribute
            continue
        obj = importlib.import_module(module)
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def named_modules(path: Path) -> list[str]:
    """Module paths and dotted names the page names in backticks: `keys.py`, `bert_repro.flops`,
    `speed/kernels.py`'s ..., `src/bert_repro/data/glue_tasks.yaml`, `conf/table/table5.yaml`."""
    found = []
    for text in backticked(path):
        for word in re.split(r"[\s(),]+", text):
            word = re.sub(r"'s$", "", word).rstrip(":;.")
            if re.fullmatch(r"bert_repro(\.\w+)+", word):
                found.append(word)
            elif (re.fullmatch(r"[\w./-]+\.(py|yaml|ipynb)", word) and "<" not in word and "*" not in word
                  and not word.startswith(("my", "/"))):
                found.append(word)
    return found


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_every_module_and_file_named_exists(page):
    missing = [name for name in named_modules(page) if not resolves(name)]
    assert not missing, f"{page_id(page)} names modules or files that do not exist: {missing}"


def test_architecture_lists_every_module():
    """docs/architecture.md's layout names each module of src/bert_repro by its path, and nothing else."""
    text = (REPO / "docs" / "architecture.md").read_text()
    block = re.search(r"## Layout.*?```text\n(.*?)```", text, flags=re.S).group(1)
    listed = {line.split()[0] for line in block.splitlines() if line.strip() and not line.startswith(" ")}
    listed = {name for name in listed if not name.startswith("src/")}
    tree = {str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if p.name != "__init__.py"}
    tree |= {str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.yaml")}
    tree |= {"speed/__init__.py"}  # a package whose __init__ holds code (SpeedOptions)
    assert tree - listed == set(), f"modules docs/architecture.md does not list: {sorted(tree - listed)}"
    assert listed - tree == set(), f"architecture.md lists modules not in the tree: {sorted(listed - tree)}"




def test_make_curves_names_the_folder_of_the_csv_run_before_it():
    """training.md's `make curves RUN=outputs/<task>/<name>` draws the `logger=csv` run its block starts just
    before: the folder that run's command makes."""
    from bert_repro.lifecycle.hydra_hooks import run_name

    lines = commands(REPO / "docs" / "training.md")
    curves = next(i for i, line in enumerate(lines) if line.startswith("make curves RUN="))
    run = next(line for line in reversed(lines[:curves]) if "logger=csv" in line).split()[2:]
    task = next(arg.split("=")[1] for arg in run if arg.startswith("task="))
    assert lines[curves].split()[2] == f"RUN=outputs/{task}/{run_name(run)}"

# -- what the code's comments name -----------------------------------------------------------------------
# names a comment may give that are no file of this repository: the scripts of other projects the code follows
# (google-research/bert, the SQuAD site's official scorers, transformers' examples), the files Hydra and
# Lightning write into a run folder, and placeholders
ELSEWHERE = {"run_squad.py", "run_classifier.py", "run_pretraining.py", "create_pretraining_data.py",
             "modeling.py", "evaluate-v1.1.py", "evaluate-v2.0.py", "run_qa.py",
             ".hydra/config.yaml", "overrides.yaml", "hparams.yaml",
             "script.py", "bert_repro.X"}
COMMENTED = ("src", "tests", "conf")  # with the Makefile: the code whose comments are read
NAMED = re.compile(r"bert_repro(?:\.\w+)+|(?<![\w./-])[A-Za-z0-9.][\w./-]*\.(?:py|yaml)\b")


def comments(path: Path) -> list[str]:
    """The comments of a Python file (its docstrings too), a YAML file or the Makefile."""
    text = path.read_text()
    if path.suffix != ".py":
        return re.findall(r"(?:^|\s)#(.*)$", text, flags=re.M)  # after a blank: a quoted "#..." is no comment
    tokens = tokenize.generate_tokens(io.StringIO(text).readline)
    found = [t.string for t in tokens if t.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            found.append(ast.get_docstring(node, clean=False) or "")
    return found


@cache
def repository_files() -> tuple[str, ...]:
    return tuple(str(p.relative_to(REPO)) for top in (*COMMENTED, "experiments", "docs", "tools")
                 for p in (REPO / top).rglob("*") if p.is_file())


def stale_names(path: Path) -> list[str]:
    """Modules and .py / .yaml files the comments of ``path`` name that exist nowhere: a dotted name must
    import (an attribute must be there), a path must be a file from the repository, src/ or the package, or
    end a path of one (`task/pretrain.yaml`, `test_tables_e2e.py`)."""
    stale = []
    for comment in comments(path):
        for name in NAMED.findall(comment):
            name = name.rstrip(".")
            if (name in ELSEWHERE or name.startswith("bert_repro") and resolves(name) or
                    not name.startswith("bert_repro") and (resolves(name) or any(
                        f == name or f.endswith("/" + name) for f in repository_files()))):
                continue
            stale.append(name)
    return stale


def commented_files() -> list[Path]:
    return [REPO / "Makefile", *(p for top in COMMENTED for p in sorted((REPO / top).rglob("*"))
                                 if p.suffix in (".py", ".yaml") and "__pycache__" not in p.parts)]


@pytest.mark.slow
def test_every_module_and_file_a_comment_names_exists():
    stale = {str(p.relative_to(REPO)): names for p in commented_files() if (names := stale_names(p))}
    assert not stale, f"comments name modules or files that do not exist: {stale}"


ISSUE = re.compile(r"\b[Ii]ssues? #?\d+|(?<![\w&/])#\d{1,3}\b")  # our tracker's numbers, not a library's


@pytest.mark.slow
def test_no_comment_cites_an_issue_number():
    """A comment says what a thing is and why, not which issue asked for it: the issue is closed by then."""
    cited = {str(p.relative_to(REPO)): found for p in commented_files()
             if (found := [m for c in comments(p) for m in ISSUE.findall(c)])}
    assert not cited, f"comments cite issue numbers: {cited}"

def test_a_comment_naming_a_renamed_module_or_config_is_found(tmp_path):
    code, config = tmp_path / "code.py", tmp_path / "config.yaml"
    code.write_text('"""Scored as bert_repro.metrics.squad does, priced by bert_repro.tables.schedule."""\n'
                    "x = 1  # see conf/task/squad_v1.yaml and conf/task/squad_v9.yaml, not tasks/spans.py\n")
    config.write_text("steps: 10  # bert_repro.tables.spec.Schedule, bert_repro.tables.spec.Plan\n"
                      "# conf/table/*, scale/paper.yaml, scale/galactic.yaml\n")
    assert sorted(stale_names(code)) == ["bert_repro.tables.schedule", "conf/task/squad_v9.yaml",
                                         "tasks/spans.py"]
    assert stale_names(config) == ["bert_repro.tables.spec.Plan", "scale/galactic.yaml"]
    assert ISSUE.findall("as issue 17 asked (#44, issues 39), not Lightning #20550 nor color #ff0000") == [
        "issue 17", "#44", "issues 39"]

# -- extending.md: a task of one's own, from config alone ---------------------------------------------------
def own_task_yaml() -> str:
    text = (REPO / "docs" / "extending.md").read_text()
    return re.search(r"^```yaml\n(# @package _global_\n.*?)^```", text, flags=re.M | re.S).group(1)


REVIEWS = ("review,stars\nA fine product that works well,5\nBroke after a day,1\nExactly as described,5\n"
           "Would not buy again,1\n")


def write_own_task(tmp_path: Path) -> Path:
    conf = tmp_path / "my_conf" / "task"
    conf.mkdir(parents=True)
    (conf / "reviews.yaml").write_text(own_task_yaml())
    data = tmp_path / "reviews"
    data.mkdir()
    for split in ("train", "dev"):
        (data / f"{split}.csv").write_text(REVIEWS)
    return data


@pytest.mark.slow
def test_own_task_from_config_alone(tmp_path, monkeypatch):
    """extending.md's YAML, as written, under a config folder of one's own: composed with hydra.searchpath,
    its files read with their labels mapped onto its own label names, its module sized for them."""
    data = write_own_task(tmp_path)
    monkeypatch.setenv("REVIEWS", str(data))
    cfg = hydra_config([f"hydra.searchpath=[file://{tmp_path / 'my_conf'}]", "task=reviews",
                        f"paths.cache_dir={tmp_path / 'cache'}"])
    assert cfg.task.name == "reviews" and cfg.hydra.run.dir == "outputs/reviews/task-reviews"
    HydraConfig.instance().set_config(cfg)  # ${hydra:runtime.cwd} in paths, as under src/train.py
    datamodule = instantiate(cfg.data, _convert_="all")
    assert datamodule.spec.labels == ("negative", "positive") and datamodule.dev_splits == ["dev"]
    rows = datamodule.raw_splits()
    assert rows["train"]["label"] == [1, 0, 1, 0] and rows["dev"]["text_a"][1] == "Broke after a day"
    from bert_repro.tasks.classification import SequenceClassificationModule

    tiny = dict(hidden_size=32, num_layers=1, num_heads=2, vocab_size=64)
    module = SequenceClassificationModule(model=tiny,
                                          optim=OmegaConf.to_container(cfg.optim), task=cfg.module.task,
                                          num_labels=cfg.module.num_labels)
    assert sorted(module.val_metrics[0].keys()) == ["val/acc", "val/f1"]


def test_own_task_refuses_a_missing_key():
    from bert_repro.data.glue import glue_task

    facts = yaml.safe_load(own_task_yaml())["task"]["own"]
    del facts["labels"]
    with pytest.raises(ValueError, match=r"missing \['labels'\]"):
        glue_task(facts)


@pytest.mark.e2e
def test_own_task_trains_and_its_checkpoint_says_what_it_is(tmp_path, minilm_dir, monkeypatch):
    """extending.md's task, trained through src/train.py as its page says (a tiny model for speed; the page's
    relative my_conf is composed from its folder by test_every_command_in_docs_is_current): results.json
    carries its metrics, and its checkpoint's identity its own name and label names."""
    monkeypatch.setenv("REVIEWS", str(write_own_task(tmp_path)))
    run = tmp_path / "run"
    proc = run_py(f"hydra.searchpath=[file://{tmp_path / 'my_conf'}]", "task=reviews", "model=tiny",
                  f"data.tokenizer={minilm_dir}", "data.batch_size=2", "optim.epochs=1", "logger=csv",
                  "trainer.enable_progress_bar=false", f"paths.cache_dir={tmp_path / 'cache'}",
                  f"hydra.run.dir={run}")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    results = json.loads((run / "results.json").read_text())
    assert {"val/acc", "val/f1"} <= set(results["metrics"]["final"]), results["metrics"]["final"]
    assert results["identity"]["task"] == "reviews"
    assert results["identity"]["labels"] == ["negative", "positive"]
    assert (run / "checkpoints" / "best.ckpt").is_file()
