"""The contract between a tool host and what runs its tools (standard tools, an MCP server)."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from typing import Any, Protocol

from actors.tools.protocol.spec import ToolSpec
from actors.tools.protocol.wire import Answer

__all__ = [
    "APPROVED_LANDING", "ASK", "FREE_CPUS", "PROGRESS", "Asker", "Reporter", "ToolProvider",
    "landing_of", "starting_process",
]

# Where the call being run was approved to write (wire: ``request.landing``), set by the
# host around ``run`` in its worker thread; None when no landing was approved. A provider
# that writes checks where the write really lands against it (docs/approval.md).
APPROVED_LANDING: ContextVar[str | None] = ContextVar("approved_landing", default=None)

class Asker(Protocol):
    """Asks the person a question for the call being run: (server, message, form schema) ->
    (action: accept | decline | cancel, the form's values when accepted). It blocks the
    calling thread until the answer, ``budget_s`` or the call's cancel. The call's clock
    stops while it waits: a provider with limits of its own adds ``budget_s`` to them."""

    budget_s: float

    def __call__(
        self, server: str, message: str, schema: Mapping[str, Any]
    ) -> tuple[str, dict[str, Any]]: ...


# The asker of the call being run (wire: ``ask``), set by the host around ``run`` in its
# worker thread; None when nobody can answer (the request's ``ask_s`` was 0).
ASK: ContextVar[Asker | None] = ContextVar("ask", default=None)

# Tells the caller how far the call being run is: (done, total or None, message). Safe from
# any thread (it only posts), cheap enough to call per notification.
Reporter = Callable[[float, "float | None", str], None]

# The reporter of the call being run (wire: ``progress``), set by the host around ``run``;
# None when the caller wants no progress.
PROGRESS: ContextVar[Reporter | None] = ContextVar("progress", default=None)


# The CPUs a process started by a tool may run on, set by the host once in each worker
# thread; None when the thread is not held to fewer (no host, or nothing to pin). A host's
# workers keep to its loop's CPU, and a process inherits its starter's CPUs: see
# starting_process.
FREE_CPUS: ContextVar[frozenset[int] | None] = ContextVar("free_cpus", default=None)


@contextlib.contextmanager
def starting_process() -> Iterator[None]:
    """Around starting a process from a tool: the process gets every CPU of the host's
    (``FREE_CPUS``), not the one its worker thread keeps to. Only a call that starts a
    process pays for the two affinity changes (~12 us each on a VM), not every call."""
    free = FREE_CPUS.get()
    if free is None:
        yield
        return
    home = os.sched_getaffinity(0)
    with contextlib.suppress(OSError):  # a CPU set that shrank since: the process stays here
        os.sched_setaffinity(0, free)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, home)


class ToolProvider(Protocol):
    """Runs a set of tools inside a tool host process.

    ``run`` is called from a worker thread of the host, one call per thread. It must return
    by ``timeout_s``; the host then gives up on it, answers Failed, and sets ``cancel``, which
    it also sets when the caller gives up. A tool that runs a subprocess kills it when
    ``cancel`` is set instead of running on unobserved. The answer's ``id`` is left at 0: the
    host fills it in.
    """

    def specs(self) -> list[ToolSpec]: ...

    def run(
        self, tool: str, arguments: Mapping[str, Any], timeout_s: float, cancel: threading.Event
    ) -> Answer: ...

    def close(self) -> None: ...


def landing_of(provider: ToolProvider, tool: str, arguments: Mapping[str, Any]) -> tuple[str, str]:
    """Where a call of ``tool`` would write and why that is protected (("", "") when it
    writes no path, or the provider does not say): a provider says it with an optional
    ``landing(tool, arguments)`` method."""
    said = getattr(provider, "landing", None)
    if said is None:
        return "", ""
    found: tuple[str, str] = said(tool, arguments)
    return found
