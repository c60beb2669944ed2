"""Checkpoint interop: Hugging Face-format directories, original Google TF checkpoints, our Lightning files.

One module per job: ``names`` (the parameter-name maps and config keys), ``safe`` (``torch.load`` with
``weights_only=True``), ``loaders`` (``load_checkpoint``, the one entry point, and ``build_model``),
``export`` (Hugging Face format, pre-trained or fine-tuned with its head), ``parity`` (ours against
transformers) and ``cli``: ``python -m bert_repro.convert check SRC`` compares our encoder with
transformers layer by layer; ``python -m bert_repro.convert to-hf SRC OUT`` writes any loadable checkpoint
in HF format.
"""

from bert_repro.convert.export import export_finetuned, export_hf
from bert_repro.convert.loaders import LoadedCheckpoint, build_model, load_checkpoint, read_tf_checkpoint
from bert_repro.convert.names import config_from_hf, hf_config, hf_to_ours, ours_to_hf, tf_to_hf
from bert_repro.convert.safe import CheckpointError, safe_torch_load

__all__ = ["CheckpointError", "LoadedCheckpoint", "build_model", "config_from_hf", "export_finetuned",
           "export_hf", "hf_config", "hf_to_ours", "load_checkpoint", "ours_to_hf", "read_tf_checkpoint",
           "safe_torch_load", "tf_to_hf"]
