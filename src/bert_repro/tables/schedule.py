"""A table's pre-training schedule, read from the configs Hydra composes for its runs: which checkpoints it
writes, and at which length their positions were trained. Where ``scale.pretrain.two_phase.in_tables``
(budget, paper) it is v2 A.2's two phases, phase 2 resuming phase 1; a step checkpoint is written every
``checkpoint_every_n_steps`` steps by the phase that reaches it."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass

from hydra.errors import HydraException
from omegaconf import OmegaConf

from bert_repro.lifecycle.folder import LAST, step_checkpoint_name, step_of
from bert_repro.lifecycle.keys import flatten as flat_keys
from bert_repro.lifecycle.keys import is_science
from bert_repro.tables import TableError
from bert_repro.tables.compose import compose_run

STEP_N = step_checkpoint_name(0).replace("0", "<N>")  # the folder's name for a step checkpoint, in words


@dataclass(frozen=True)
class Schedule:
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
        step = step_of(name)
        if step is None:
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


def _compose(where: str, args: list[str]):
    try:
        return compose_run(args)
    except HydraException as err:
        raise TableError(f"{where}: does not compose ({err})") from None


def schedule_of(where: str, args: list[str]) -> tuple[Schedule, str]:
    """The schedule of the pre-training ``where`` with these overrides, read from the configs src/train.py
    composes for it (inside compose.composing): the run's, or its two phases'; and its store name."""
    run = _compose(where, args)
    every = run.module.checkpoint_every_n_steps
    if not OmegaConf.select(run, "scale.pretrain.two_phase.in_tables", default=False):
        schedule = Schedule(int(run.optim.max_steps), int(run.data.max_seq_length), every)
        return schedule, store_name(run, schedule)
    one = _compose(where, [*args, "experiment=pretrain_phase1"])
    two = _compose(where, [*args, "experiment=pretrain_phase2"])
    first, last = int(one.optim.max_steps), int(two.optim.max_steps)
    if not 0 < first < last:
        raise TableError(f"{where}: phase 1 runs {first} steps (scale.pretrain.two_phase.phase1_steps); "
                         f"expected between 0 and max_steps={last}")
    schedule = Schedule(last, int(one.data.max_seq_length), every, first, int(two.data.max_seq_length))
    return schedule, store_name(run, schedule)


# not part of a pre-training's identity: the scale node acts through the data and optim keys it interpolates
# into, and an ablation's name is a label (Table 8's mask_80_10_10 is the default masking, Table 5's none)
LABELS = ("scale.", "ablation.name")


def store_name(run, schedule: Schedule) -> str:
    """A pre-training's folder name in the shared store: its shape and a hash of its science keys (keys.py),
    composed and resolved, with its schedule: tables that ask for the same pre-training share it."""
    leaves = flat_keys(OmegaConf.to_container(run, resolve=False))
    science = {k: OmegaConf.select(run, k) for k in sorted(leaves)
               if is_science(k) and not k.startswith(LABELS)}
    science["schedule"] = asdict(schedule)
    digest = hashlib.sha1(json.dumps(science, sort_keys=True, default=str).encode()).hexdigest()[:10]
    m = run.model
    return f"L{m.num_layers}_H{m.hidden_size}_A{m.num_heads}-{digest}"
