"""The package's floors (DESIGN.md "Layout", pyproject.toml [tool.importlinter]) hold as `make lint` checks
them, and a science module that imports the lifecycle breaks them; no module imports one that imports it
back; the records the table collector reads load without torch."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[1]


def lint_imports(src: Path) -> subprocess.CompletedProcess:
    """import-linter's command line on the package under ``src``, with the project's contracts."""
    config = str(ROOT / "pyproject.toml")
    command = [str(Path(sys.executable).with_name("lint-imports")), config, "--no-cache"]
    return subprocess.run(command, cwd=src, env={**os.environ, "PYTHONPATH": str(src)}, capture_output=True,
                          text=True)


def test_the_floors_hold():
    proc = lint_imports(ROOT / "src")
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("science", ["model", "data/base", "tasks/span"])
def test_a_science_module_that_imports_the_lifecycle_breaks_them(tmp_path, science):
    shutil.copytree(ROOT / "src" / "bert_repro", tmp_path / "bert_repro",
                    ignore=shutil.ignore_patterns("__pycache__"))
    module = tmp_path / "bert_repro" / f"{science}.py"
    late = "\n\ndef late():\n    from bert_repro.lifecycle.run import train\n"  # inside a function counts too
    module.write_text(module.read_text() + late)
    proc = lint_imports(tmp_path)
    name = "bert_repro." + science.replace("/", ".")
    assert proc.returncode == 1, proc.stdout
    assert f"- {name} -> bert_repro.lifecycle.run" in proc.stdout, proc.stdout


def test_no_module_imports_one_that_imports_it_back():
    graph = grimp.build_graph("bert_repro", cache_dir=None)
    cycles = sorted(module for module in graph.modules
                    for imported in graph.find_modules_directly_imported_by(module)
                    if graph.chain_exists(importer=imported, imported=module))
    assert not cycles, f"modules on an import cycle: {cycles}"


def test_the_collectors_records_load_without_torch():
    code = ("import sys, bert_repro.selection, bert_repro.lifecycle.results, bert_repro.scores\n"
            "print(sorted({'torch', 'lightning'} & set(sys.modules)))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "[]", proc.stdout
