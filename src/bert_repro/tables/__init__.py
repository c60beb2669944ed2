"""The paper's tables as products: ``make table5 SCALE=smoke`` runs a table's sweeps, then collects them.

    python -m bert_repro.tables run table5 --scale smoke      # the sweeps (complete ones skipped), collected
    python -m bert_repro.tables collect table5 --scale smoke  # only the collection: md, csv, tex (+ plots)

``spec.py`` reads conf/table/<table>.yaml into sweeps with fixed run folders, ``runner.py`` launches them
through ``src/train.py -m`` (any Hydra launcher), ``collect.py`` applies the table's selection rule to the
results.json files and ``render.py`` writes experiments/results/<table>.{md,csv,tex} and the figures.
"""

TABLES = ("table1", "table2", "table3", "table4", "table5", "table6", "table7", "table8", "figure4")
DEMOS = ("table5_demo",)  # `make demo`: Table 5 in miniature on the embedded corpus (smoke scale only)
SCALES = ("smoke", "budget", "paper")

from pathlib import Path  # noqa: E402

REPO = Path(__file__).resolve().parents[3]
CONF_DIR = REPO / "conf"


class TableError(ValueError):
    """A wrong table name, scale, table config or result file: the message names it."""
