"""Speed apart from the science: the trainer options (SpeedOptions) that model.py's one encoder reads at its
switch points, and what is behind them (layout.py: where a batch's tokens sit and the attention that suits
them; kernels.py: CPU dropout and attention, varlen attention; loss.py: the fused MLM decoder and loss;
packing.py: several instances per row; compile_model). None changes what is computed:
tests/test_speed_options.py proves each equal, in loss and gradients, to the path with every option off."""

from __future__ import annotations

import torch
from torch import nn

from bert_repro.config import SpeedOptions  # the speed: node's one declaration

__all__ = ["DYNAMO", "SpeedOptions", "compile_model"]

# the prediction mask's boolean index (the N real predictions of B x P) and unpadding's token index stay in
# the graph, whose output sizes depend on the data
DYNAMO = {"capture_dynamic_output_shape_ops": True}


def compile_model(model: nn.Module, device_type: str) -> None:
    """``model.compile()`` (Inductor): the forward, the loss where the model computes it, and through
    AOTAutograd their backward, each one graph (tests/test_compile.py). On CPU, Inductor draws random numbers
    with ATen's generator (``fallback_random``): its per-element Philox made dropout the costliest kernel of
    a compiled CPU step."""
    for key, value in DYNAMO.items():
        setattr(torch._dynamo.config, key, value)
    if device_type == "cpu":
        from torch._inductor import config

        config.fallback_random = True
    model.compile()
