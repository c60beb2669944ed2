"""Safe loading: ``torch.load`` with ``weights_only=True`` only, and the error every reader raises."""

from __future__ import annotations

from pathlib import Path

import torch


class CheckpointError(ValueError):
    """A checkpoint that cannot be read or does not fit the encoder; the message names the path."""




def _first_line(err: BaseException) -> str:
    """torch's unpickling errors run to paragraphs of advice; keep the line that says what was refused."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    advice = ("Weights only load failed", "Check the documentation", "Please file an issue")
    reason = next((line for line in lines if not line.startswith(advice)), lines[0] if lines else "")
    return f"{type(err).__name__}: {reason}"


def safe_torch_load(path: str | Path, map_location="cpu", what: str = "loadable", mmap: bool = False) -> dict:
    """``torch.load`` with ``weights_only=True`` only: tensors and plain containers, never pickled code (a
    checkpoint from elsewhere may carry a payload that unpickling would run). Refusals name the file.
    ``mmap``: tensors mapped, not read (what a caller needs is beside them)."""
    try:
        return torch.load(path, weights_only=True, map_location=map_location, mmap=mmap)
    except FileNotFoundError:
        raise
    except Exception as err:  # torch raises UnpicklingError, RuntimeError, EOFError ... for a bad file
        raise CheckpointError(f"{path}: not {what} with torch.load(weights_only=True), which accepts only "
                              f"tensors and plain containers ({_first_line(err)})") from None
