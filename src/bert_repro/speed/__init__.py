"""Speed apart from the science: ``accelerate`` turns a model.py model into its fast twin on the same
parameters (same names, same state dict), by the trainer options in SpeedOptions. With every option off
the model is returned untouched and model.py's readable path is what runs."""

from __future__ import annotations

from torch import nn

from bert_repro.model import BertForPreTraining, BertModel, Layer, MLMHead
from bert_repro.speed.encoder import (
    FastBertForPreTraining,
    FastBertModel,
    FastLayer,
    FastMLMHead,
    SpeedOptions,
)
from bert_repro.speed.kernels import CpuDropout

__all__ = ["SpeedOptions", "accelerate", "compile_model"]


def accelerate(model: nn.Module, options: SpeedOptions | dict | None) -> nn.Module:
    """``model`` with each of its BertModels (and, with ``kernels``, its dropouts, MLM head and pre-training
    forward) given the fast subclass's forward, in place: subclasses add no parameters or buffers, so
    state dicts, converters and checkpoints are unchanged. Called where the model is built (the task
    modules' constructors), with the options they were constructed with."""
    options = SpeedOptions(**options) if isinstance(options, dict) else options
    if options is None or not options.any:
        return model
    swaps: dict[type, type] = {BertModel: FastBertModel, Layer: FastLayer}
    if options.kernels:
        swaps |= {nn.Dropout: CpuDropout, MLMHead: FastMLMHead}
    if options.kernels or options.pack:
        swaps[BertForPreTraining] = FastBertForPreTraining
    for module in model.modules():
        fast = swaps.get(type(module))
        if fast is not None:
            module.__class__ = fast  # the same object and parameters, the fast forward
        if isinstance(module, FastBertModel):
            module.speed = options
    return model


def compile_model(model: nn.Module, device_type: str) -> None:
    """``model.compile()`` (Inductor). On CPU, Inductor draws random numbers with ATen's generator
    (``fallback_random``): its per-element Philox made dropout the costliest kernel of a compiled CPU step."""
    if device_type == "cpu":
        import torch._inductor.config

        torch._inductor.config.fallback_random = True
    model.compile()
