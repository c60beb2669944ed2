"""Speed apart from the science: the trainer options (SpeedOptions) that model.py's one encoder reads at its
switch points, and the kernels behind them (kernels.py: CPU dropout and attention, varlen attention; loss.py:
the fused MLM decoder and loss; packing.py: several instances per row). None changes what is computed:
tests/test_speed_options.py proves each equal, in loss and gradients, to the path with every option off."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from bert_repro.speed.kernels import VARLEN_BACKENDS

__all__ = ["SpeedOptions", "compile_model"]


@dataclass(frozen=True)
class SpeedOptions:
    """What trainer/ switches on (run.py's ``speed``), passed to the model's constructors. All off: model.py's
    plain path (SDPA on the padded batch, nn.Dropout's kernel, the logits and F.cross_entropy)."""

    kernels: bool = False  # CPU dropout and attention, the sparse last layer, the fused MLM decoder + loss
    unpad: bool = False  # layers and attention on the real tokens only (varlen attention)
    activation_checkpointing: bool = False  # recompute each layer in the backward pass: memory for compute
    attention: str = "auto"  # the varlen kernel: auto | flash | nested | padded (speed/kernels.py)
    pack: bool = False  # pre-training: several short instances per row (speed/packing.py)

    def __post_init__(self) -> None:
        if self.attention not in VARLEN_BACKENDS:
            raise ValueError(
                f"speed attention={self.attention!r}: expected one of {', '.join(VARLEN_BACKENDS)}"
            )


def compile_model(model: nn.Module, device_type: str) -> None:
    """``model.compile()`` (Inductor). On CPU, Inductor draws random numbers with ATen's generator
    (``fallback_random``): its per-element Philox made dropout the costliest kernel of a compiled CPU step."""
    if device_type == "cpu":
        import torch._inductor.config

        torch._inductor.config.fallback_random = True
    model.compile()
