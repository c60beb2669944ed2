"""The network's deadline: every request huggingface_hub makes, and datasets through it (downloads, uploads,
Hub look-ups), waits at most ``network.timeout_s`` (the convert CLI's ``--timeout``) for an answer, and is
not tried again once that long has passed since its first try went unanswered. A Hub that is silent, refuses
or cannot be found then ends as ``Unreachable``: what was being reached, where, the deadline, and how to work
without the network."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from huggingface_hub.utils import httpx

DEFAULT_S = 60.0
FAULTS = (httpx.TimeoutException, httpx.NetworkError, ConnectionError)  # NetworkError: refused, no such host
OFFLINE = "HF_HUB_OFFLINE=1 reads local files and the caches only, without waiting on the network"


class Unreachable(Exception):
    """The Hub did not answer (silent, refused, no such host): the message says what was reached and how to do
    without it. A run exits 69 (sysexits' EX_UNAVAILABLE)."""


class NotCached(ValueError):
    """HF_HUB_OFFLINE is set and what a run needs is not cached: a wrong input, exit 2, with what to give."""


class Unanswered(Exception):
    """A request tried again after the deadline passed without an answer: raised instead of the library's
    next retry, which would wait once more (huggingface_hub retries a timeout 5 times, sleeping 23 s in all).
    ``fault`` is the last try's error: datasets drops the chain (``raise e1 from None``)."""

    def __init__(self, url: str, fault: Exception):
        super().__init__(f"{url}: {fault or type(fault).__name__}")
        self.fault = fault


class _Deadline:
    seconds, key = DEFAULT_S, "network.timeout_s="
    lock = threading.Lock()
    unanswered: dict[tuple[str, str], tuple[float, Exception]] = {}  # request -> first try's time, last error


class BoundedClient(httpx.Client):
    """huggingface_hub's shared client (``set_client_factory``) with the deadline on every request, also those
    sent with ``timeout=None`` (``repo_info``: ``snapshot_download``'s first call; ``create_repo``)."""

    def send(self, request: httpx.Request, **kwargs) -> httpx.Response:
        seconds, now, tried = _Deadline.seconds, time.monotonic(), (request.method, str(request.url))
        with _Deadline.lock:
            first, fault = _Deadline.unanswered.get(tried, (now, None))
        if fault is not None and now - first >= seconds:
            raise Unanswered(str(request.url), fault)
        phases = request.extensions.get("timeout") or dict.fromkeys(("connect", "read", "write", "pool"))
        request.extensions["timeout"] = {phase: min(seconds, value if value is not None else seconds)
                                         for phase, value in phases.items()}
        try:
            response = super().send(request, **kwargs)
        except FAULTS as err:
            with _Deadline.lock:
                _Deadline.unanswered[tried] = (first, err)
            raise
        with _Deadline.lock:
            _Deadline.unanswered.pop(tried, None)
        return response


def set_deadline(seconds: float, key: str = "network.timeout_s=") -> None:
    """Every Hub request of this process (and of the processes it forks) bounded by ``seconds``; ``key`` is
    the setting that chose it (``--timeout=``), named in the messages."""
    from huggingface_hub import constants, set_client_factory
    from huggingface_hub.utils._http import hf_request_event_hook  # the library's: offline mode, request ids

    _Deadline.seconds, _Deadline.key = float(seconds), key
    # the library's own settings, which it passes explicitly: the ETag look-up and the download's reads
    constants.HF_HUB_ETAG_TIMEOUT = constants.HF_HUB_DOWNLOAD_TIMEOUT = seconds
    set_client_factory(lambda: BoundedClient(follow_redirects=True,
                                             event_hooks={"request": [hf_request_event_hook]}))


def network_fault(err: BaseException) -> BaseException | None:
    """The network fault under ``err`` (a timeout, a refused connection, an unknown host, offline mode), as
    huggingface_hub chains them (LocalEntryNotFoundError), or datasets' ConnectionError, whose chain it
    drops; None when there is none."""
    from huggingface_hub.errors import OfflineModeIsEnabled

    seen: BaseException | None = err
    chain: set[int] = set()
    while seen is not None and id(seen) not in chain:
        if isinstance(seen, Unanswered):
            return seen.fault
        if isinstance(seen, FAULTS + (OfflineModeIsEnabled,)):
            return seen
        chain.add(id(seen))
        seen = seen.__cause__ or seen.__context__
    return None


def _where(fault: BaseException) -> str:
    from huggingface_hub import constants

    try:
        url = fault.request.url  # type: ignore[attr-defined]
        return f"{url.scheme}://{url.netloc.decode()}"
    except (AttributeError, RuntimeError):  # RuntimeError: an httpx error raised without its request
        return constants.ENDPOINT


@contextmanager
def reaching(what: str, offline: str, upload: bool = False) -> Iterator[None]:
    """``what`` (``init=org/name``, ``the Hub data set nyu-mll/glue``) fetched inside (sent, when ``upload``):
    a network fault becomes ``Unreachable`` naming it, the endpoint, the deadline, and ``offline``: how to do
    without the network; HF_HUB_OFFLINE with nothing cached, ``NotCached``."""
    from huggingface_hub import constants
    from huggingface_hub.errors import OfflineModeIsEnabled

    with _Deadline.lock:  # each fetch starts afresh: an earlier one's unanswered tries are not its retries
        _Deadline.unanswered.clear()
    try:
        yield
    except Exception as err:
        fault = network_fault(err)
        if fault is None:
            raise
        if isinstance(fault, OfflineModeIsEnabled) or constants.is_offline_mode():
            why = "needs the Hub, and HF_HUB_OFFLINE is set: unset it" if upload else (
                "is not in the Hugging Face cache and HF_HUB_OFFLINE is set")
            raise NotCached(f"{what} {why}; {offline}") from None
        seconds, key = f"{_Deadline.seconds:g}", _Deadline.key
        if isinstance(fault, httpx.TimeoutException):
            why = f"got no answer from {_where(fault)} within {seconds} s ({key}{seconds})"
        else:
            why = f"cannot connect to {_where(fault)} ({fault or type(fault).__name__})"
        raise Unreachable(f"{what} {why}; {offline}" + ("" if upload else f"; {OFFLINE}")) from None
