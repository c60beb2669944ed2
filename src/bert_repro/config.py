"""Typed configs (Hydra structured configs): a value of the wrong type fails when the config is composed,
with OmegaConf's message naming the key (``optim.lr=abc``), not an hour into a run. A misspelled key
(``optim.lrr=1``) fails there too, as every composed node is closed to new keys.

Ranges (``optim.warmup_ratio=5``) and the model's shape (``model.hidden_size=770 model.num_heads=12``) are
declared here too, beside each key, and ``check`` tests them on the composed config: OmegaConf types a node
but never runs a dataclass's ``__post_init__``, so ``checks.validate`` calls ``check`` before torch loads.
Relations across nodes and the run's places (paths, devices, checkpoints) are ``checks.check_inputs``'."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _rates(value: Any) -> bool:  # Adam's beta1, beta2
    return isinstance(value, Sequence) and len(value) == 2 and all(_number(b) and 0 <= b < 1 for b in value)


def ranged(default: Any, test: Callable[[Any], bool], expected: str) -> Any:
    """A field whose value, when not null, passes ``test``; ``expected`` completes "expected ..."."""
    metadata = {"test": test, "expected": expected}
    if isinstance(default, list):  # a dataclass field takes no mutable default
        return field(default_factory=lambda: list(default), metadata=metadata)
    return field(default=default, metadata=metadata)


def option(parse: Callable[[str], Any], test: Callable[[Any], bool], expected: str) -> Callable[[str], Any]:
    """A command-line option's argparse ``type``, checked at parse time as a config key is here: argparse
    then names the option and exits 2."""

    def read(text: str) -> Any:
        try:
            value = parse(text)
        except ValueError:
            value = None
        if value is None or not test(value):
            raise argparse.ArgumentTypeError(f"{text!r}: expected {expected}")
        return value

    return read


def positive(default: Any, what: str = "number") -> Any:
    return ranged(default, lambda v: _number(v) and v > 0, f"a positive {what}")


def whole_positive(default: Any, what: str) -> Any:
    return ranged(default, lambda v: _whole(v) and v > 0, f"a positive whole number of {what}")


def fraction(default: Any, interval: str = "[0, 1]") -> Any:
    low, high = interval[0] == "[", interval[-1] == "]"  # which ends are inside

    def test(v: Any) -> bool:
        return _number(v) and (0 <= v if low else 0 < v) and (v <= 1 if high else v < 1)

    return ranged(default, test, f"a fraction in {interval}")


@dataclass
class OptimConfig:
    """The optimizer recipe and run length (§3.4, §4): conf/base/finetune.yaml and task/pretrain.yaml."""

    lr: float = positive(2e-5)
    betas: list[float] = ranged([0.9, 0.999], _rates, "two decay rates in [0, 1)")
    eps: float = positive(1e-6)
    weight_decay: float = ranged(0.01, lambda v: _number(v) and v >= 0, "0 or more")
    warmup_steps: int | None = ranged(None, lambda v: _whole(v) and v >= 0, "0 or more steps, or null")
    warmup_ratio: float | None = fraction(None)
    max_steps: int = ranged(-1, lambda v: _whole(v) and (v == -1 or v > 0),
                            "a positive number of steps, or -1 (epochs decide)")
    epochs: int | None = whole_positive(None, "epochs, or null with optim.max_steps")
    gradient_clip_val: float | None = positive(None, "norm, or null (no clipping)")
    val_check_interval: Any = positive(1.0, "fraction of an epoch or number of steps")
    limit_val_batches: Any = ranged(1.0, lambda v: _number(v) and v >= 0,
                                    "a fraction or a number of batches (0: no validation)")
    schedule_steps: int | None = whole_positive(None, "steps, or null")  # the two-phase schedule (v2 A.2)
    # phase 2: the step phase 1 stopped at
    resume_step: int | None = ranged(None, lambda v: _whole(v) and v >= 0, "0 or more steps")

    @staticmethod
    def relations(node: DictConfig) -> str | None:
        if node.get("epochs") is None and node.get("max_steps") in (None, -1):
            return "optim.epochs and optim.max_steps are both unset: give one, or the run never ends"
        return None


ATTENTION_BACKENDS = ("auto", "flash", "nested", "padded")  # unpad's varlen kernels (speed/kernels.py)


def choice(default: str, options: tuple[str, ...]) -> Any:
    return ranged(default, lambda v: v in options, f"one of {', '.join(options)}")


@dataclass
class SpeedOptions:
    """How fast a run goes, never what it computes (keys.py: the speed node is not science): the one
    declaration of the speed: node (its schema and defaults; trainer/ files set what differs) and what the
    model's constructors, the DataModules and run.py read. Every default is model.py's plain path;
    tests/test_speed_options.py proves each option equal to it in loss and gradients."""

    per_device_batch_size: int | None = whole_positive(None, "sequences, or null")  # null: global / ranks
    compile: bool = False  # torch.compile the encoder
    unpad: bool = False  # embeddings to head on real tokens only, varlen attention (MosaicBERT)
    # CPU dropout masks and attention, the sparse last layer, the fused MLM decoder + loss
    fast_kernels: bool = False
    pack: bool = False  # pre-training: several short instances per row, block-diagonal attention
    attention: str = choice("auto", ATTENTION_BACKENDS)  # unpad's varlen kernel
    activation_checkpointing: bool = False  # recompute each layer in the backward pass: memory for compute
    peak_tflops: float | None = positive(None, "dense peak in TFLOP/s, or null")  # the MFU denominator
    num_workers: int = ranged(0, lambda v: _whole(v) and v >= 0, "0 or more worker processes")
    num_proc: int = whole_positive(1, "processes")  # datasets.map: tokenization, pre-training instances
    # longest: pad each batch to its longest; max_length: to data.max_seq_length, as the released code
    padding: str = choice("longest", ("longest", "max_length"))
    # with compile on CUDA, "longest" rounds up to a multiple of this (at most data.max_seq_length): a few
    # shapes, so one compile (and its CUDA graphs) serves the run; eager and CPU steps take any length
    length_bucket: int = whole_positive(32, "tokens")
    # DDP's gradient all-reduce (trainer=ddp, ddp_cpu; trainer.py gives them to DDPStrategy): the bucket size
    # (null: torch's 25 MB) and the dtype sent, bf16 halving the bytes through torch's bf16_compress_hook
    # (tests/test_ddp.py: the loss equal to fp32's within bf16 rounding)
    bucket_cap_mb: int | None = whole_positive(None, "MB, or null (torch's 25)")
    grad_allreduce: str = choice("fp32", ("fp32", "bf16"))

    def __post_init__(self) -> None:  # built in Python (a module's hyper-parameters): the same ranges
        wrong = _out_of_range(self, "speed")
        if wrong:
            raise ValueError(wrong[0])


@dataclass
class ModelConfig:
    """The encoder's shape (§3.1) as conf/base/model.yaml declares it. Defaults are BERT-base (L=12, H=768,
    A=12); model.BertConfig is this and the tokenizer's vocab_size."""

    hidden_size: int = whole_positive(768, "units")
    num_layers: int = whole_positive(12, "layers")
    num_heads: int = whole_positive(12, "heads")
    intermediate_size: int | None = whole_positive(None, "units, or null (4H)")  # None: 4H (§3.1, footnote)
    max_position: int = whole_positive(512, "positions")
    type_vocab_size: int = whole_positive(2, "segment types")
    hidden_dropout: float = fraction(0.1, "[0, 1)")  # §3.5: dropout 0.1 on all layers
    attention_dropout: float = fraction(0.1, "[0, 1)")
    layer_norm_eps: float = positive(1e-12)  # google-research/bert's LayerNorm epsilon
    initializer_range: float = positive(0.02)
    causal: bool = False  # the left-to-right ablation (§5.1): each position sees only its left context

    @staticmethod
    def relations(node: DictConfig) -> str | None:
        if node.hidden_size % node.num_heads:  # each head takes hidden_size / num_heads dimensions
            return (f"model.hidden_size={node.hidden_size} is not divisible by model.num_heads="
                    f"{node.num_heads}: expected a hidden size that splits evenly across the heads (e.g. "
                    "H=768 with A=3, 4, 6, 12)")
        return None


@dataclass
class DataConfig:
    """What a task's data node may hold beyond its DataModule's own arguments, with the ranges the command
    line is held to. Not composed as a structured config: each task's data node is its DataModule's
    arguments, and a closed node of the keys shared here would refuse the others (glue_dir, squad_dir ...);
    the values are checked, types included, by ``check``."""

    batch_size: int = ranged(32, lambda v: _whole(v) and v > 0, "a positive number of sequences")  # global
    max_seq_length: int = whole_positive(128, "tokens")
    max_train_examples: int | None = whole_positive(None, "examples, or null (all)")
    max_dev_examples: int | None = whole_positive(None, "examples, or null (all)")
    # debug and speed (keys.py): Dev scored on this many examples, in the same run folder as a full run
    max_eval_examples: int | None = whole_positive(None, "examples, or null (all)")
    dev_from_train: Any = ranged(None, lambda v: _whole(v) and v > 0 or _number(v) and 0 < v < 1,
                                 "a number of rows, or a fraction in (0, 1)")
    doc_stride: int = whole_positive(128, "tokens")
    max_query_length: int = whole_positive(64, "tokens")
    train_examples: int = whole_positive(1024, "examples")
    dev_examples: int = whole_positive(256, "examples")
    max_words: int = whole_positive(48, "words")
    vocab_size: int = whole_positive(30522, "tokens")
    max_predictions_per_seq: int = whole_positive(20, "tokens")
    masked_lm_prob: float = fraction(0.15)
    short_seq_prob: float = fraction(0.1)
    dupe_factor: int = whole_positive(1, "rounds")
    val_fraction: float = fraction(0.05, "[0, 1)")
    max_documents: int | None = whole_positive(None, "documents, or null (all)")


@dataclass
class NetworkConfig:
    """How long a Hub request waits for an answer (network.py): conf/train.yaml's network node."""

    timeout_s: float = positive(60, "number of seconds")


SCHEMAS = {"optim": OptimConfig, "model": ModelConfig, "data": DataConfig, "speed": SpeedOptions,
           "network": NetworkConfig}


def _shown(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)  # warmup_ratio=5 reads back as 5.0


def _out_of_range(node: Any, name: str, schema: type | None = None) -> list[str]:
    """``name.key=value: expected ...`` for each key of ``node`` (a config node, or a dataclass instance of
    ``schema``) whose value is out of its declared range."""
    schema = schema or type(node)
    wrong = []
    keys = set(node.keys()) if isinstance(node, DictConfig) else None
    for spec in fields(schema):
        if keys is not None and spec.name not in keys:  # asked of keys(): OmegaConf raises inside `in`
            continue
        # get resolves an interpolation once (a plan checks thousands); a ??? key reads as None, not checked
        value = getattr(node, spec.name) if keys is None else node.get(spec.name)
        if "test" in spec.metadata and value is not None and not spec.metadata["test"](value):
            # a value another key set (${scale.pretrain.max_steps}) names that key: the one a user typed
            raw = (OmegaConf.to_container(node, resolve=False)[spec.name]
                   if keys is not None and OmegaConf.is_interpolation(node, spec.name) else None)
            wrong.append(f"{name}.{spec.name}={_shown(value)}{f' (from {raw})' if raw else ''}: expected "
                         f"{spec.metadata['expected']}")
    return wrong


def problems(node: Any, name: str, schema: type | None = None) -> list[str]:
    """What is wrong with ``node`` (a config node, or a dataclass instance of ``schema``): each key out of its
    declared range, then the schema's relations between keys; [] when nothing is."""
    schema = schema or type(node)
    wrong = _out_of_range(node, name, schema)
    relation = schema.relations(node) if not wrong and hasattr(schema, "relations") else None
    return wrong + ([relation] if relation else [])


def check(cfg: DictConfig) -> None:
    """A ValueError naming the first key of ``cfg`` whose value is out of its declared range."""
    for name, schema in SCHEMAS.items():
        node = cfg.get(name)
        wrong = problems(node, name, schema) if isinstance(node, DictConfig) else []
        if wrong:
            raise ValueError(wrong[0])


# conf/ composes /schema/optim, /schema/model and /schema/speed under the YAML that sets their values: stored
# where they are declared, as Hydra's structured configs are, so whatever imports them can compose conf/
ConfigStore.instance().store(group="schema", name="optim", node=OptimConfig)
ConfigStore.instance().store(group="schema", name="model", node=ModelConfig)
ConfigStore.instance().store(group="schema", name="speed", node=SpeedOptions)
