"""The package's imports run one way: no module imports, at any depth or inside a function, a module that
imports it back. Lower layers name none above them (data/ names no run, task, converter or checkpoint
reader; the torch-free record and selection modules name no torch module)."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "bert_repro"


def import_graph() -> dict[str, set[str]]:
    """module -> the package's modules it imports (top-level or inside functions)."""
    modules = {".".join(("bert_repro", *p.relative_to(PACKAGE).with_suffix("").parts)): p
               for p in PACKAGE.rglob("*.py")}
    modules = {name.removesuffix(".__init__"): path for name, path in modules.items()}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("bert_repro"):
                names = [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names if a.name.startswith("bert_repro")]
            for name in names:
                while name not in modules and "." in name:
                    name = name.rsplit(".", 1)[0]
                if name in modules and name != module:
                    graph[module].add(name)
    return graph


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in graph[todo.pop()] - seen:
            seen.add(nxt)
            todo.append(nxt)
    return seen


@pytest.mark.slow
def test_no_module_imports_one_that_imports_it_back():
    graph = import_graph()
    cycles = sorted(m for m in graph if m in reachable(graph, m))
    assert not cycles, f"modules on an import cycle: {cycles}"


@pytest.mark.parametrize("lower,above", [
    ("bert_repro.data", ("bert_repro.lifecycle.run", "bert_repro.lifecycle.build",
                         "bert_repro.lifecycle.spec", "bert_repro.tasks", "bert_repro.convert",
                         "bert_repro.lifecycle.pretrained", "bert_repro.lifecycle.evaluation",
                         "bert_repro.tables")),
    ("bert_repro.lifecycle.results", ("bert_repro.lifecycle.run", "bert_repro.model", "bert_repro.tasks",
                                      "bert_repro.speed")),
    ("bert_repro.selection", ("bert_repro.lifecycle.run", "bert_repro.lifecycle.build",
                              "bert_repro.lifecycle.spec", "bert_repro.model", "bert_repro.tasks",
                              "bert_repro.speed")),
    ("bert_repro.identity", ("bert_repro.lifecycle.run", "bert_repro.model", "bert_repro.tasks",
                                       "bert_repro.convert")),
])
@pytest.mark.slow
def test_lower_layers_name_nothing_above_them(lower, above):
    graph = import_graph()
    modules = [m for m in graph if m == lower or m.startswith(lower + ".")]
    # selection imports run/data lazily for --submit only: count top-level imports there
    wrong = {m: sorted(n for n in graph[m] if n.startswith(above)) for m in modules}
    if lower == "bert_repro.selection":
        wrong = {m: [n for n in names if n not in LAZY_SUBMIT] for m, names in wrong.items()}
    assert not any(wrong.values()), wrong


# selection --submit predicts through the run's builders
LAZY_SUBMIT = {"bert_repro.lifecycle.build", "bert_repro.lifecycle.spec"}
