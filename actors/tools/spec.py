"""What a tool host offers, and the contract between a host and what runs its tools."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Mapping
from typing import Any, Protocol

from actors.records import ResultClass

__all__ = ["Answer", "CancellableProvider", "ToolProvider", "ToolSpec"]


@dataclasses.dataclass(frozen=True, slots=True)
class ToolSpec:
    name: str
    description: str
    parameters: Mapping[str, Any]  # JSON schema of the arguments object
    result_class: ResultClass = ResultClass.PUBLIC
    needs_approval: bool = False
    untrusted: bool = False  # results come from outside (web, MCP open-world tools)


# The answer to one call, without the wire id: one of the wire module's
# Result / Failed / Denied / PendingApproval (see actors.tools.wire).
Answer = Any


class ToolProvider(Protocol):
    """Runs a set of tools inside a tool host process.

    ``run`` is called from a worker thread of the host, one call per thread, and must
    return by ``timeout_s`` (the host gives up on it after that and answers Failed).
    """

    def specs(self) -> list[ToolSpec]: ...

    def run(self, tool: str, arguments: Mapping[str, Any], timeout_s: float) -> Answer: ...

    def close(self) -> None: ...


class CancellableProvider(ToolProvider, Protocol):
    """A provider that can stop a call early (optional; the host uses it when present).

    The host sets ``cancel`` when the call passes its timeout or the caller gives up, so a
    tool that runs a subprocess can kill it at once instead of running on unobserved.
    """

    def run_cancellable(
        self, tool: str, arguments: Mapping[str, Any], timeout_s: float, cancel: threading.Event
    ) -> Answer: ...
