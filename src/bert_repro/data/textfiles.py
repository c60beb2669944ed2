"""Text input files: what is not text is refused by name, and a byte that is not UTF-8 is named by line.

Task files (GLUE, SWAG, SQuAD, CoNLL) must be UTF-8: a label or an answer offset read wrong would go
unnoticed, so ``require_utf8`` stops at the first bad byte. Pre-training corpora are read as
google-research/bert reads them instead (undecodable bytes dropped: corpus.py).
"""

from __future__ import annotations

from pathlib import Path

# File signatures of the compressed formats corpora and task files travel in.
COMPRESSED = {b"\x1f\x8b": "gzip", b"BZh": "bzip2", b"\xfd7zXZ\x00": "xz", b"PK\x03\x04": "zip",
              b"(\xb5/\xfd": "zstd"}
SNIFF_BYTES = 1 << 16
# Share of undecodable bytes in the first 64 KB above which a file is not text: Latin-1 prose has a few
# percent, a binary file most.
MAX_UNDECODABLE = 0.1


def refuse_non_text(path: str | Path, expected: str) -> None:
    """A ValueError naming ``path`` when its first 64 KB are compressed, binary, or mostly not UTF-8."""
    with open(path, "rb") as f:
        head = f.read(SNIFF_BYTES)
    kind = next((name for magic, name in COMPRESSED.items() if head.startswith(magic)), None)
    if kind is not None:
        raise ValueError(f"{path} is {kind}-compressed, not text; decompress it first (expected {expected})")
    if b"\x00" in head:
        raise ValueError(f"{path} is a binary file (it holds NUL bytes), not text; expected {expected}")
    undecodable = head.decode("utf-8", errors="replace").count("\ufffd")
    if head and undecodable > MAX_UNDECODABLE * len(head):
        raise ValueError(f"{path} is mostly not text ({undecodable} of its first {len(head)} bytes are not "
                         f"UTF-8); expected {expected}")


def require_utf8(path: str | Path, expected: str) -> None:
    """The whole file is UTF-8 text (an optional BOM); else a ValueError naming its line and byte."""
    refuse_non_text(path, expected)
    data = Path(path).read_bytes()
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise ValueError(f"{path} line {line}: byte 0x{data[err.start]:02x} is not UTF-8 ({err.reason}); "
                         f"expected {expected} in UTF-8 (re-encode it, e.g. iconv -f latin1 -t utf-8)"
                         ) from None
