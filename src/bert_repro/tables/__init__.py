"""The paper's tables as products (``make table5 SCALE=smoke``): spec.py reads conf/table/<table>.yaml into
sweeps, runner.py launches them through ``src/train.py -m``, collect.py applies the selection rules and
render.py writes experiments/results/<table>.{md,csv,tex,json} and the figures."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
CONF_DIR = REPO / "conf"
SCALES = ("smoke", "budget", "paper")


def _table_configs(pattern: str) -> tuple[str, ...]:
    """conf/table's configs named ``pattern``, tables then figures (the Makefile reads the same files)."""
    names = [p.stem for p in (CONF_DIR / "table").glob("*.yaml") if re.fullmatch(pattern, p.stem)]
    return tuple(sorted(names, key=lambda n: (n.startswith("figure"), int(re.sub(r"\D", "", n) or 0), n)))


TABLES = _table_configs(r"(table|figure)\d+")
DEMOS = _table_configs(r".+_demo")  # `make demo`: Table 5 in miniature, at SCALE=smoke only


class TableError(ValueError):
    """A wrong table name, scale, table config or result file: the message names it."""
