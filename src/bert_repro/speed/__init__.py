"""Speed apart from the science: the trainer options (SpeedOptions) that model.py's one encoder reads at its
switch points, and the kernels behind them (kernels.py: CPU dropout and attention, varlen attention; loss.py:
the fused MLM decoder and loss; packing.py: several instances per row). None changes what is computed:
tests/test_speed_options.py proves each equal, in loss and gradients, to the path with every option off."""

from __future__ import annotations

from torch import nn

from bert_repro.config import SpeedOptions  # the speed: node's one declaration

__all__ = ["SpeedOptions", "compile_model"]


def compile_model(model: nn.Module, device_type: str) -> None:
    """``model.compile()`` (Inductor). On CPU, Inductor draws random numbers with ATen's generator
    (``fallback_random``): its per-element Philox made dropout the costliest kernel of a compiled CPU step."""
    if device_type == "cpu":
        import torch._inductor.config

        torch._inductor.config.fallback_random = True
    model.compile()
