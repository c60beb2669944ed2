"""What a checkpoint is: the task, head, label set, science settings and trained sequence length of the run
that wrote it. Every ``.ckpt`` carries it (``BertTaskModule.on_save_checkpoint``) and every exported folder
(config.json's ``bert_repro`` entry), so a checkpoint of one task or setting is never silently taken for
another: ``ckpt_path=`` into another task or setting is refused, ``init=`` from another task's fine-tuned
checkpoint keeps the encoder and drops its head, and ``src/evaluate.py`` refuses another task's head."""

from __future__ import annotations

from typing import Any

from bert_repro import keys
from bert_repro.keys import comparable, flatten

IDENTITY_KEY = "bert_repro"  # an exported folder's config.json entry holding the identity
# keys a checkpoint written before identities existed still carries (the SameRun callback's settings)
_SAME_RUN = "SameRun"
# the only science keys phase 2 of the pre-training recipe (v2 A.2, experiment=pretrain_phase2) may change
# when it continues phase 1's checkpoint through ckpt_path=: its sequence length, its length of run, where its
# vocabulary is read (its content must be the same: vocab_refusal) and which steps phase 1 kept checkpoints
# of. Every other key (the model, the objective, the corpus, the schedule's shape) must be the checkpoint's.
SCHEDULE_KEYS = ("data.max_seq_length", "data.max_predictions_per_seq", "data.tokenizer", "optim.max_steps",
                 "optim.resume_step", "module.checkpoint_every_n_steps",
                 "scale.pretrain.checkpoint_every_n_steps")
# model-node fields a run sets for itself whatever its checkpoint was trained with: regularisation and the
# initialisation of new weights act only while training. Every other field is the checkpoint's architecture.
RUN_OWN = ("hidden_dropout", "attention_dropout", "initializer_range")


def run_identity(task: str, module: Any, labels: Any, max_seq_length: int | None,
                 science: dict[str, Any]) -> dict[str, Any]:
    """The identity of a run's checkpoints. ``head``: the task module's class and its head parameters' shapes
    (all but the encoder's), so a classifier of 3 labels is not another of 2."""
    head = {k: list(v.shape) for k, v in module.state_dict().items() if not k.startswith("model.bert.")}
    return {"task": task, "head": {"module": type(module).__name__, "parameters": head},
            "labels": list(labels) if labels is not None else None, "max_seq_length": max_seq_length,
            "science": science}


def checkpoint_identity(checkpoint: dict[str, Any]) -> dict[str, Any] | None:
    """The identity a loaded ``.ckpt`` dict carries; for one written before identities, its task and science
    settings from the resume check's record (no head or labels then)."""
    if checkpoint.get("identity"):
        return checkpoint["identity"]
    settings = ((checkpoint.get("callbacks") or {}).get(_SAME_RUN) or {}).get("settings")
    if not settings:
        return None
    return {"task": (settings.get("task") or {}).get("name"), "head": None, "labels": None,
            "max_seq_length": (settings.get("data") or {}).get("max_seq_length"), "science": settings}


def init_identity(checkpoint: dict[str, Any]) -> dict[str, Any] | None:
    """What a run started from (``init=``) wherever the file lies: a checkpoint of ours by its run's identity
    and global step, so a table moved to another disk is the same run and another checkpoint put at the same
    path is not; None for a checkpoint without an identity, which is known by its path alone."""
    identity = checkpoint_identity(checkpoint)
    return None if identity is None else {"identity": identity, "step": checkpoint.get("global_step")}


def describe(identity: dict[str, Any]) -> str:
    labels = identity.get("labels")
    return f"task={identity.get('task')}" + (f" (labels {', '.join(map(str, labels))})" if labels else "")


def science_differences(saved: dict[str, Any] | None, now: dict[str, Any] | None,
                        ignore: tuple[str, ...] = (), was: str = "checkpoint") -> list[str]:
    """``key: checkpoint X, now Y`` for each science key that differs, less the keys in ``ignore`` and
    those under them."""
    a, b = comparable(flatten(saved or {})), comparable(flatten(now or {}))
    names = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k)
                   and not any(k == i or k.startswith(f"{i}.") for i in ignore))
    return [changed(k, a, b, was) for k in names]


def changed(key: str, saved: dict[str, Any], now: dict[str, Any], was: str = "was") -> str:
    """One science key that differs, as a refusal names it: a key the record lacks may be one added since
    it was written, which keys.ADDED turns back into the science it had (docs/extending.md)."""
    if key in keys.ADDED and key not in saved:  # written before the key: it computed that value
        return f"{key}: absent (so {keys.ADDED[key]!r}), now {now.get(key)!r}"
    if key not in saved:
        return (f"{key}: absent, now {now.get(key)!r} (a key added since? bert_repro/keys.py ADDED declares "
                "the value runs had before it)")
    return f"{key}: {was} {saved[key]!r}, now {now.get(key)!r}"


def unknown_model_refusal(source: str, unknown: dict[str, Any]) -> str | None:
    """Why a checkpoint whose model node sets fields this encoder does not have cannot be read, or None."""
    if not unknown:
        return None
    named = ", ".join(f"model.{k}={v!r}" for k, v in sorted(unknown.items()))
    return (f"{source}: its model sets {named}, which this version's encoder (bert_repro.model.BertConfig) "
            "does not have; its weights belong to another architecture and are not loaded as this one. Use "
            "the version of bert-repro that wrote it")


def architecture_differences(saved: dict[str, Any], now: dict[str, Any],
                             taken: tuple[str, ...] = ()) -> list[str]:
    """``model.key: checkpoint X, this run Y`` for each field of the whole model node that differs (or that
    only one side has), less the run's own (RUN_OWN) and ``taken`` (fields the run took from the
    checkpoint)."""
    skip = (*RUN_OWN, *taken)
    saved, now = _model_node(saved), _model_node(now)
    keys = sorted(k for k in (saved or {}).keys() | (now or {}).keys()
                  if k not in skip and (saved or {}).get(k, _ABSENT) != (now or {}).get(k, _ABSENT))
    return [f"model.{k}: checkpoint {_shown(saved, k)}, this run {_shown(now, k)}" for k in keys]


_ABSENT = object()


def _model_node(node: dict[str, Any] | None) -> dict[str, Any]:
    """A model node less its keys.ADDED fields at the value runs had before them (keys.comparable)."""
    kept = comparable({f"model.{k}": v for k, v in (node or {}).items()})
    return {k.removeprefix("model."): v for k, v in kept.items()}


def _shown(node: dict[str, Any] | None, key: str) -> str:
    return repr(node[key]) if key in (node or {}) else "has no such key"


def resume_refusal(path: str, saved: dict[str, Any] | None, now: dict[str, Any],
                   continues_schedule: bool) -> str | None:
    """Why ``ckpt_path=path`` (a checkpoint of another run folder) cannot be resumed by this run, or None.
    Another task never; other science settings only when this run continues the checkpoint's schedule
    (optim.resume_step: phase 2 changes the SCHEDULE_KEYS, never the model or the objective)."""
    if saved is None:
        return None  # not one of ours with a record (e.g. written by an older version): Lightning decides
    if saved.get("task") != now["task"]:
        return (f"ckpt_path={path} is a checkpoint of {describe(saved)}, not of this run's {describe(now)}; "
                "resuming it would report its weights as this task's. Pass it as init= to fine-tune from its "
                "encoder, or ckpt_path=null")
    differ = science_differences(saved.get("science"), now["science"],
                                 SCHEDULE_KEYS if continues_schedule else ())
    if differ:
        return (f"ckpt_path={path} was written with other settings than this run's "
                f"({'; '.join(differ[:6])}); resume it with its own settings, or pass it as init= to start a "
                "new run from its weights")
    return None


def vocab_refusal(path: str, saved: list[str] | None, vocab: list[str] | None,
                  source: str | None) -> str | None:
    """Why ``ckpt_path=path``, trained on the vocabulary ``saved``, cannot go on with this run's, or None: a
    token id must name the same word under its embeddings, whatever file the run reads it from."""
    if saved is None or vocab is None or list(saved) == list(vocab):
        return None
    first = next((i for i, (a, b) in enumerate(zip(saved, vocab)) if a != b), min(len(saved), len(vocab)))
    at = (f"id {first} is {saved[first]!r} there, {vocab[first]!r} here"
          if first < min(len(saved), len(vocab)) else f"{len(saved)} tokens there, {len(vocab)} here")
    return (f"ckpt_path={path} was trained with another vocabulary than this run's "
            f"({source or 'the one trained on data.corpus'}): {at}, so its embeddings would read other "
            f"words. Resume it with its own vocabulary (data.tokenizer={path})")


def head_mismatch(saved: dict[str, Any] | None, now: dict[str, Any]) -> str | None:
    """Why a checkpoint's trained head is not this run's head (another task, another label set, other head
    shapes), or None when it is the same head."""
    if saved is None or saved.get("task") is None:
        return None
    if saved.get("task") != now["task"]:
        return f"it was fine-tuned on {describe(saved)}, not {describe(now)}"
    if saved.get("labels") is not None and saved.get("labels") != now.get("labels"):
        return f"its labels are {saved['labels']}, this run's {now.get('labels')}"
    head = (saved.get("head") or {}).get("parameters")
    if head is not None and head != now["head"]["parameters"]:
        return f"its head has the parameters {head}, this run's {now['head']['parameters']}"
    return None
