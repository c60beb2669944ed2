"""Every command in the README's code blocks still works as written, checked without running anything:
``src/train.py`` / ``src/evaluate.py`` lines composed by Hydra with the same overrides, ``python -m
bert_repro.X`` lines parsed by their own argument parser (``--help``), ``make X`` lines by ``make -n``. A
stale line fails the test naming it; lines that cannot be checked offline are listed below with the reason."""

import getopt
import os
import re
import runpy
import shlex
import subprocess
import sys

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser

from .conftest import REPO
from .helpers import ended, started
from .test_run_names import hydra_config

# first words of the lines no offline check can prove, and why
UNCHECKED = {
    "pip": "installs from a package index",
    "PIP_EXTRA_INDEX_URL": "installs torch from PyTorch's index",
    "hf": "downloads from the Hugging Face Hub",
    "source": "a shell built-in that changes the calling shell",
    "apt-get": "a system package install",
    "wandb": "W&B's own CLI (sync uploads)",
    "tensorboard": "TensorBoard's own server",
    "mlflow": "MLflow's own server",
    "git": "the repository's history",
    "export": "SLURM's own commands (squeue, scontrol) on a running cluster",
    "sbatch": "submits to a SLURM cluster",
    "srun": "runs on a SLURM cluster",
}
PYTHON_C = "python -c: a one-line check of an exported folder that needs a model written first"


def commands(page=REPO / "README.md") -> list[str]:
    """A page's shell code-block lines (blocks with no language, or bash) as a shell reads them: continuations
    joined, comments dropped. Blocks marked yaml, text ... are not commands."""
    text = page.read_text()
    lines = []
    for language, block in re.findall(r"^```(\w*)\n(.*?)^```", text, flags=re.M | re.S):
        if language not in ("", "bash"):
            continue
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words:
                lines.append(line.split(" #")[0].strip())
    return lines


def words_of(line: str) -> list[str]:
    line = re.sub(r"<[^>]*>", "X", line)  # <ckpt>, <all-MiniLM-L6-v2 dir>: placeholders for a value
    words = [w for w in shlex.split(line, comments=True) if w != "..."]  # "..." stands for the rest
    while words and (words[0] == "sudo" or re.fullmatch(r"[A-Z_]+=\S*", words[0])):
        if words[0].startswith("PIP_EXTRA_INDEX_URL"):
            return words
        words = words[1:]
    return words


def compose_line(config: str, args: list[str]) -> None:
    """``args`` composed as Hydra would (a sweep as its first value), then the range checks."""
    from bert_repro.config import check

    overrides, skip = [], False
    for arg in args:
        if skip or arg.startswith("-"):  # -m, --help, --cfg job
            skip = arg in ("--cfg", "-c")
            continue
        parsed = OverridesParser.create().parse_override(arg)
        if parsed.is_sweep_override():
            arg = f"{parsed.get_key_element()}={next(iter(parsed.sweep_string_iterator()))}"
        overrides.append(arg)
    cfg = hydra_config(overrides, config)
    check(cfg)


def parse_module(module: str, args: list[str], capsys) -> None:
    """``python -m module args --help``: the module's parser takes the subcommand and exits 0."""
    argv = sys.argv
    sys.argv = [module, *args, "--help"]
    try:
        with pytest.raises(SystemExit) as exit_:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
    finally:
        sys.argv = argv
        capsys.readouterr()
    assert exit_.value.code in (0, None), f"exit {exit_.value.code}"


def check_line(line: str, capsys) -> str:
    """What was checked ("compose", "parse", "make -n") or why it was not."""
    words = words_of(line)
    first = words[0]
    if first in UNCHECKED or first.split("=")[0] in UNCHECKED:
        return UNCHECKED.get(first) or UNCHECKED[first.split("=")[0]]
    if first == "torchrun":
        words = ["python", *words[next(i for i, w in enumerate(words) if w.endswith(".py")):]]
    if words[:2] == ["python", "-c"] or words[0].endswith("/python") and words[1:2] == ["-c"]:
        return PYTHON_C
    if words[0] == "python" and words[1].endswith(("src/train.py", "src/evaluate.py")):
        compose_line("train" if words[1].endswith("train.py") else "evaluate", words[2:])
        return "compose"
    if words[:3] == ["python", "-m", "timeit"]:  # a figure's command: its setup runs, its statements compile
        options, statements = getopt.getopt(words[3:], "n:r:s:u:pv",
                                            ["number=", "repeat=", "setup=", "unit="])
        scope: dict = {}
        for setup in (value for option, value in options if option in ("-s", "--setup")):
            exec(setup, scope)  # noqa: S102 (the page's own setup)
        for statement in statements:
            compile(statement, line, "exec")
        return "timeit setup"
    if words[0] == "python" and words[1] == "-m":
        parse_module(words[2], words[3:], capsys)
        return "parse"
    if words[0] == "make":
        proc = subprocess.run(["make", "-n", *words[1:]], cwd=REPO, capture_output=True, text=True,
                              timeout=60)
        assert proc.returncode == 0, proc.stderr[-500:]
        return "make -n"
    raise AssertionError("no check for this kind of command: add one, or list it in UNCHECKED with why")


@pytest.mark.slow
def test_every_readme_command_is_current(capsys):
    lines = commands()
    assert len(lines) > 12  # the README's blocks were found
    stale, kinds = [], {}
    for line in lines:
        try:
            kind = check_line(line, capsys)
        except BaseException as err:  # noqa: BLE001 (Hydra's and SystemExit alike: the line is named)
            said = str(err).splitlines()[0] if str(err) else ""
            stale.append(f"{line}\n    -> {type(err).__name__}: {said}")
            continue
        kinds[kind] = kinds.get(kind, 0) + 1
    assert not stale, "stale README commands:\n" + "\n".join(stale)
    assert kinds["compose"] >= 6 and kinds["make -n"] >= 4 and kinds["parse"] >= 2, kinds


def quick_start() -> tuple[list[str], list[str]]:
    """The README's quick-start command and the paths it says the command leaves."""
    text = (REPO / "README.md").read_text()
    section = text[text.index("## Quick start"):text.index("## One run")]
    command = next(line for line in commands(REPO / "README.md") if "experiment=quickstart" in line)
    shown = re.findall(r"^(outputs/\S+)", section, flags=re.M)
    return shlex.split(command), shown


@pytest.mark.e2e
def test_quick_start_leaves_every_path_the_readme_shows(tmp_path, shared_data, minilm_dir):
    """The README's first run, as written, offline, in a fresh folder: every path it shows exists after it.
    Shortened by speed-only keys (trainer.*), which leave the run folder's name as the README shows it; the
    full run's Dev accuracy is in docs/benchmarks.md."""
    words, shown = quick_start()
    assert words[:2] == ["python", "src/train.py"] and len(shown) >= 3, (words, shown)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "BERT_REPRO_SHARED_DATA": str(shared_data)}
    # Dev is read whole (optim.limit_val_batches is science, and the trainer's own is overridden by it): real
    # tokens only through the encoder (speed.unpad), and no sanity check ahead of it
    short = ["+trainer.limit_train_batches=2", "+trainer.num_sanity_val_steps=0", "speed.unpad=true",
             "trainer.enable_progress_bar=false"]
    fresh, log = tmp_path / "fresh", tmp_path / "output.log"
    fresh.mkdir()
    command = [sys.executable, str(REPO / words[1]), *words[2:], *short]
    code, output = ended(started(command, log, cwd=fresh, env=env), log)
    assert code == 0, output[-3000:]
    missing = [path for path in shown if not (fresh / path).exists()]
    assert not missing, f"the README shows {missing}, which the quick start did not write"
