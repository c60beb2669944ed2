"""A table's pre-training schedule, read from conf/scale/<scale>.yaml and the table's overrides, and the
checks that a spec can be trusted against it: which checkpoints the schedule writes, where, and which sequence
length their position embeddings were trained at.

At budget and paper scale every pre-training is the v2 two-phase schedule (Appendix A.2: 90% of the steps at
128 tokens, the rest at 512; ``scale.pretrain.two_phase.in_tables``); phase 2 resumes phase 1's weights,
optimizer and learning-rate schedule (conf/experiment/pretrain_phase2.yaml). ``step-<N>.ckpt`` is written
every ``checkpoint_every_n_steps`` global steps by the phase that reaches N; ``last.ckpt`` is the last
phase's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from omegaconf import OmegaConf

from bert_repro.tables import CONF_DIR, TableError

STEP_CKPT = re.compile(r"^step-(\d+)\.ckpt$")


@dataclass(frozen=True)
class Schedule:
    max_steps: int
    seq_length: int  # single phase: the run's length; two phases: phase 1's
    every: int | None  # step-<N>.ckpt cadence (None: only last.ckpt / best.ckpt)
    phase1_steps: int | None = None  # None: one phase
    phase2_seq_length: int | None = None

    @property
    def phases(self) -> int:
        return 1 if self.phase1_steps is None else 2

    def trained_length(self, phase: int) -> int:
        """The longest sequence the position embeddings of a checkpoint of ``phase`` were trained at."""
        return self.phase2_seq_length if phase == 2 else self.seq_length

    def checkpoint_step(self, name: str, where: str) -> int:
        """The global step a checkpoint of this schedule holds; a name the schedule never writes is an
        error."""
        if name == "last.ckpt":
            return self.max_steps
        found = STEP_CKPT.match(name)
        if found is None:
            raise TableError(f"{where}: checkpoint {name!r}; expected last.ckpt or step-<N>.ckpt")
        step = int(found.group(1))
        if not self.every:
            raise TableError(f"{where}: {name} is never written: this schedule keeps no step checkpoints "
                             "(scale.pretrain.checkpoint_every_n_steps is null)")
        if step % self.every or not 0 < step <= self.max_steps:
            raise TableError(f"{where}: {name} is never written: the schedule saves step-<N>.ckpt every "
                             f"{self.every} steps up to {self.max_steps} (N a multiple of {self.every}, "
                             f"0 < N <= {self.max_steps})")
        return step

    def phase_of(self, step: int) -> int:
        return 1 if self.phase1_steps is None or step <= self.phase1_steps else 2


def _value(overrides: dict, keys: tuple[str, ...], default):
    for key in keys:
        if key in overrides:
            return overrides[key]
    return default


def schedule_of(scale: str, overrides: dict) -> Schedule:
    """The schedule a pre-training sweep with these (flattened) overrides runs: conf/scale/<scale>.yaml's
    ``pretrain`` block, with the table's ``scale.pretrain.*`` / ``optim.*`` / ``data.*`` overrides over it."""
    path = CONF_DIR / "scale" / f"{overrides.get('scale', scale)}.yaml"
    if not path.is_file():
        raise TableError(f"{path} does not exist (the scale a table's pre-training names)")
    pre = OmegaConf.to_container(OmegaConf.load(path).pretrain)
    phases = pre.get("two_phase") or {}
    max_steps = int(_value(overrides, ("optim.max_steps", "scale.pretrain.max_steps"), pre["max_steps"]))
    every = _value(overrides, ("scale.pretrain.checkpoint_every_n_steps",),
                   pre.get("checkpoint_every_n_steps"))
    if not phases.get("in_tables"):
        seq = _value(overrides, ("data.max_seq_length", "scale.pretrain.max_seq_length"),
                     pre["max_seq_length"])
        return Schedule(max_steps, int(seq), every)
    first = int(_value(overrides, ("scale.pretrain.two_phase.phase1_steps",), phases["phase1_steps"]))
    if not 0 < first < max_steps:
        raise TableError(f"{path}: two_phase.phase1_steps={first}; expected between 0 and "
                         f"max_steps={max_steps}")
    return Schedule(max_steps, int(phases["phase1_seq_length"]), every, first,
                    int(phases["phase2_seq_length"]))
