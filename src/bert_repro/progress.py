"""Progress of long data work: the libraries' own bars on a terminal (datasets' map bars, the tokenizers
trainer's), plain log lines elsewhere (a log file, a table runner's child), where a bar's carriage returns
would run together into one unreadable line."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

log = logging.getLogger(__name__)

EVERY_S = 30.0  # seconds between two plain progress lines


def on_terminal() -> bool:
    return sys.stderr.isatty()


@contextmanager
def datasets_progress(what: str) -> Iterator[None]:
    """Around ``datasets`` maps: their own bars on a terminal; elsewhere a plain line saying what runs, and
    the bars off until it ends (the caller logs the result)."""
    from datasets.utils.logging import disable_progress_bar, enable_progress_bar, is_progress_bar_enabled

    if on_terminal() or not is_progress_bar_enabled():
        yield
        return
    disable_progress_bar()
    log.info("%s ...", what)
    try:
        yield
    finally:
        enable_progress_bar()


def counted(items: Iterable, what: str, every_s: float | None = None) -> Iterator:
    """``items`` unchanged, and a plain line every ``every_s`` (EVERY_S) seconds: how many, how fast."""
    every_s = EVERY_S if every_s is None else every_s
    start = last = time.monotonic()
    n = 0
    for n, item in enumerate(items, 1):
        yield item
        now = time.monotonic()
        if now - last >= every_s:
            log.info("%s: %d so far (%.0f/s)", what, n, n / (now - start))
            last = now
    log.info("%s: %d in all", what, n)
