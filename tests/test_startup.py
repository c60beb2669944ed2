"""What needs no model starts without torch: `src/train.py --help` and `--cfg job` (torch and Lightning load
when a run starts), and the table collector, which reads JSON. No timing in tests: this checks the cause."""

import subprocess
import sys

import pytest

from .conftest import REPO

PROBE = """
import runpy, sys
sys.argv = {argv!r}
try:
    runpy.{runner}({target!r}, run_name="__main__"{extra})
except SystemExit as exit_:
    assert exit_.code in (0, None), exit_.code
print("heavy:", sorted(m for m in ("torch", "lightning", "transformers") if m in sys.modules))
"""


def heavy_imports(argv: list[str], runner: str, target: str, extra: str = "") -> str:
    code = PROBE.format(argv=argv, runner=runner, target=target, extra=extra)
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize("args", [["--help"], ["--cfg", "job", "task=mrpc", "model=large"]])
def test_train_py_help_and_cfg_do_not_import_torch(args):
    train = str(REPO / "src" / "train.py")
    assert heavy_imports([train, *args], "run_path", train) == "heavy: []"


def test_the_table_collector_does_not_import_torch(tmp_path):
    argv = ["bert_repro.tables", "collect", "table5_demo", "--scale", "smoke", "--logger", "none",
            "--runs-dir", str(tmp_path / "runs"), "--results-dir", str(tmp_path / "results")]
    assert heavy_imports(argv, "run_module", "bert_repro.tables", ", alter_sys=True") == "heavy: []"
    assert (tmp_path / "results" / "table5_demo.md").is_file()  # it did collect
