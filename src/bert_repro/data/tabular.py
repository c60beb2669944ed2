"""Sentence(-pair) examples from CSV / TSV / JSON files, read through the ``datasets`` builders.

TSV is read as GLUE distributes it: tab-separated, quotes literal (``csv.QUOTE_NONE``; default CSV
quoting merges MRPC rows at its quotation marks), UTF-8 with an optional BOM (MRPC). CSV has standard
quoting; JSON / JSON lines records may be nested (dotted column names reach in). ``normalise_rows``
maps a file's own columns onto text_a / text_b / label / idx and names the line of any bad row.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path

from datasets import Dataset, Features, Value, load_dataset
from datasets.exceptions import DatasetGenerationError

from bert_repro.data.base import require_text
from bert_repro.data.textfiles import require_utf8


@dataclass
class FileSpec:
    """One split's file; GlueDataModule fills in its task's GLUE layout. ``columns`` maps text_a / text_b /
    label / idx onto the file's own column names (dotted names reach into nested JSON); ``label_map`` maps
    its label values onto the task's."""

    path: str
    # tsv (quotes literal, as GLUE), csv (standard quoting) or json/jsonl; None: by suffix
    format: str | None = None
    header: bool = True
    names: list[str] | None = None  # column names of a file without a header
    columns: dict[str, str | None] = field(default_factory=dict)
    label_map: dict[str, str] | None = None
    json_field: str | None = None  # JSON: the key holding the list of records, if not at the top

    def __post_init__(self) -> None:
        if self.format is None:
            suffix = Path(self.path).suffix.lower()
            self.format = {".csv": "csv", ".json": "json", ".jsonl": "json"}.get(suffix, "tsv")
        if self.format not in ("tsv", "csv", "json"):
            raise ValueError(f"{self.path}: format={self.format!r}; expected tsv, csv or json")
        if self.label_map is not None:  # YAML may give 0: entailment; the file's values are read as text
            self.label_map = {str(k): str(v) for k, v in self.label_map.items()}
        unknown = set(self.columns) - {"text_a", "text_b", "label", "idx"}
        if unknown:
            raise ValueError(f"{self.path}: columns maps {sorted(unknown)}; expected text_a, text_b, label, "
                             "idx")


def _root_cause(err: BaseException) -> BaseException:
    while err.__cause__ or err.__context__:
        err = err.__cause__ or err.__context__
    return err


def _check_field_counts(path: Path, sep: str, quoting: int, expected: int, first_line: int) -> int:
    """Every row has the header's number of fields (pandas would fill a short row with empty strings); returns
    the number of rows."""
    rows = 0
    with path.open(encoding="utf-8-sig", newline="") as f:
        reader = csv.reader(f, delimiter=sep, quoting=quoting)
        for _ in range(first_line - 1):
            next(reader, None)
        start = reader.line_num + 1  # the line a row starts on: a quoted field may run over many
        try:
            for row in reader:
                rows += bool(row)
                if row and len(row) != expected:
                    layout = " (tab-separated, quotes literal, as GLUE's files)" if sep == "\t" else ""
                    spans = (f"; the row runs to line {reader.line_num}: is a quote on line {start} left "
                             "open?" if reader.line_num > start else "")
                    raise ValueError(f"{path} line {start}: {len(row)} fields, "
                                     f"expected {expected}{layout}{spans}")
                start = reader.line_num + 1
        except csv.Error as err:  # e.g. a field past csv's size limit, where a quote was never closed
            spans = f"; is a quote on line {start} left open?" if reader.line_num > start else ""
            raise ValueError(f"{path} line {start}: not a readable row ({err}){spans}") from None
    return rows


def read_rows(spec: FileSpec, cache_dir: Path) -> Dataset:
    """A file's rows as strings, every column kept, through the ``datasets`` csv or json builder."""
    path = Path(spec.path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist")
    if spec.format != "json" and not spec.header and spec.names is None:
        raise ValueError(f"{path}: header=false needs names (the file's column names)")
    require_utf8(path, f"a {spec.format.upper()} file")
    cache = str(cache_dir / "raw")
    resolved = str(path.resolve())  # datasets fingerprints the path as spelled: one spelling, one cache
    try:
        if spec.format == "json":
            # no records: the json builder fails with messages that name no file (or stops iterating)
            if not path.read_text(encoding="utf-8-sig").strip():
                raise ValueError(f"{path}: empty; expected at least one example")
            try:
                return load_dataset("json", data_files=resolved, field=spec.json_field, cache_dir=cache,
                                    split="train").flatten()
            except ValueError as err:
                if "corresponds to no data" not in str(err):
                    raise
                raise ValueError(f"{path}: no records; expected at least one example") from None
        sep, quoting = ("\t", csv.QUOTE_NONE) if spec.format == "tsv" else (",", csv.QUOTE_MINIMAL)
        names = spec.names
        if names is None:
            with path.open(encoding="utf-8-sig", newline="") as f:  # utf-8-sig: MRPC starts with a BOM
                names = next(csv.reader(f, delimiter=sep, quoting=quoting), [])
        # a file without rows: the csv builder's own message names no file
        if not names or not _check_field_counts(path, sep, quoting, len(names), 2 if spec.header else 1):
            raise ValueError(f"{path}: no rows{' after the header line' if names and spec.header else ''}; "
                             "expected at least one example")
        # Every column as a string: no type guessing, and "NA" / "null" / "" stay text (na_filter off).
        return load_dataset("csv", data_files=resolved, sep=sep, quoting=quoting,
                            header=0 if spec.header else None, names=list(names),
                            features=Features({n: Value("string") for n in names}), na_filter=False,
                            encoding="utf-8-sig", cache_dir=cache, split="train")
    except (DatasetGenerationError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: not a readable {spec.format.upper()} file: {_root_cause(err)}") from err


def normalise_rows(batch: dict, indices: list[int], columns: dict, labels: tuple | None,
                   label_map: dict | None, where: str, unit: str, first: int) -> dict:
    """Rows -> text_a, text_b, label (class id, or the score; -1 when unlabelled), idx; bad rows named by
    line."""
    out: dict[str, list] = {"text_a": [], "label": [], "idx": []}
    if columns["text_b"]:
        out["text_b"] = []
    for r, i in enumerate(indices):
        line = f"{where} {unit} {first + i}"
        for key in ("text_a", "text_b"):
            if columns[key]:
                text = batch[columns[key]][r]
                if text is None:
                    raise ValueError(f"{line}: no value in column {columns[key]!r} (too few fields?)")
                require_text(text, line, f"column {columns[key]!r}")
                out[key].append(str(text))
        label = -1
        if columns["label"]:
            raw = batch[columns["label"]][r]
            raw = "" if raw is None else str(raw).strip()
            raw = str(label_map.get(raw, raw)) if label_map else raw
            if labels is None:
                try:
                    label = float(raw)
                except ValueError:
                    raise ValueError(f"{line}: score {raw!r} in column {columns['label']!r} "
                                     "is not a number") from None
            elif raw in labels:
                label = labels.index(raw)
            else:
                raise ValueError(f"{line}: label {raw!r} in column {columns['label']!r} is not one of "
                                 f"{list(labels)} (map other values with label_map)")
        out["label"].append(label)
        out["idx"].append(str(batch[columns["idx"]][r]) if columns["idx"] else str(i))
    return out
