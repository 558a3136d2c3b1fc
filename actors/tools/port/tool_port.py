"""The tool port: what a session holds to call the tools of one tool host.

A :class:`ToolPort` puts three parts together, each with one job: the
:class:`~actors.tools.port.connection.Connection` (is the host there, and what does it
offer), the :class:`~actors.tools.port.calls.CallSockets` (one call on the calling
thread's own socket) and the :class:`~actors.tools.port.supervisor.HostSupervisor` (the
local host process, restarted when it dies). ``call`` blocks the calling thread until the
answer, the timeout (``tools.timeout_s`` plus a grace so that the host's own timeout answer
arrives first), or the cancel token, and never raises for a tool failure: every other
ending is ``Failed`` with a text a model can read. See ``scripts/bench_tools.py`` for what a
call costs against a bare socket.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import pykka
import zmq

from actors.base import telemetry
from actors.base.cancel import CancelToken
from actors.base.errors import WireError
from actors.tools.port import calls
from actors.tools.port.calls import CallSockets, Questions
from actors.tools.port.connection import Connection, PortState
from actors.tools.port.settings import PORT_GRACE_S, PortSettings
from actors.tools.port.supervisor import HostLauncher, HostSupervisor, PortStatus
from actors.tools.protocol import wire
from actors.tools.protocol.spec import ToolSpec
from actors.tools.protocol.wire import Answer, Failed, ToolRequest

__all__ = ["ToolPort", "start_port", "stop_ports"]


class ToolPort:
    """What a session holds per host: thin and blocking; tool failures come back as ``Failed``."""

    def __init__(
        self,
        settings: PortSettings,
        conn: Connection,
        sockets: CallSockets,
        ref: pykka.ActorRef[HostSupervisor],
    ) -> None:
        self.name = settings.name
        self.settings = settings
        self.conn = conn
        self.sockets = sockets
        self._ref = ref
        self._ids = itertools.count(1)

    def call(
        self,
        *,
        session: str,
        call: int,
        tool: str,
        arguments: Mapping[str, Any],
        cancel: CancelToken | None = None,
        approved: bool = False,
        landing: str = "",
        ask: Questions | None = None,
    ) -> Answer:
        """Run ``tool`` on the host; the answer, or Failed on timeout, cancel, or a dead host.

        ``approved``: the call was approved after the host answered PendingApproval;
        ``landing``: where the approved write was seen to land (it runs only there);
        ``ask``: how a question the call asks mid-call reaches the person (None, or its
        ``ask`` None: nobody can answer, the host answers for itself), and where its
        progress goes (none asked for without a ``progress``).
        """
        cid = next(self._ids)
        if self.conn.stopped:
            return Failed(cid, calls.closed(self.name))
        limit = self.settings.timeout_s + PORT_GRACE_S
        ask_s = 0.0 if ask is None or ask.ask is None else (ask.timeout_s or limit)
        progress = ask is not None and ask.progress is not None
        try:
            frame = wire.encode(ToolRequest(cid, session, call, tool, arguments, approved,
                                             landing, telemetry.calling(self.name, tool), ask_s,
                                             progress))
        except WireError as e:
            return Failed(cid, calls.unsendable(tool, e))
        if len(frame) > self.settings.max_frame_bytes:
            return Failed(cid, calls.too_large(tool, len(frame), self.settings.max_frame_bytes))
        return self.sockets.call(cid, tool, frame, cancel, limit, ask)

    def specs(self) -> tuple[ToolSpec, ...]:
        """The host's tools as it last announced them (empty until it first connects)."""
        return self.conn.specs

    @property
    def state(self) -> PortState:
        return self.conn.state

    def wait_ready(self, timeout: float) -> bool:
        """Wait until the host has answered with its tool list; False after ``timeout``,
        or at once when the host was given up (it exited with its usage-error code)."""
        self.conn.settled.wait(timeout)
        return self.conn.ready.is_set()

    @property
    def gave_up(self) -> bool:
        """Whether the host exited with its usage-error code and is not started again."""
        return self.conn.gave_up

    def status(self, timeout: float = 5.0) -> PortStatus:
        """State, reason, tools, pid and restarts (STOPPED once the port is closed)."""
        try:
            return self._ref.proxy().status().get(timeout=timeout)  # type: ignore[no-any-return]
        except pykka.ActorDeadError:
            return PortStatus(PortState.STOPPED, "the port was closed", (), None, 0)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the port and, for a local host, the host process (and what it left running)."""
        stop_ports([self], timeout)


def start_port(
    settings: PortSettings,
    *,
    launcher: HostLauncher | None = None,
    context: zmq.Context[Any] | None = None,
) -> ToolPort:
    """Start the supervisor (and the host process, given a launcher) and return the port."""
    ctx = context if context is not None else zmq.Context.instance()
    conn = Connection(settings, ctx)
    ref = HostSupervisor.start(settings, conn, launcher)
    return ToolPort(settings, conn, CallSockets(settings, ctx, conn), ref)


def stop_ports(ports: Sequence[ToolPort], timeout: float = 10.0) -> None:
    """Stop several ports (their host processes stop in parallel)."""
    futures = []
    for port in ports:
        with contextlib.suppress(pykka.ActorDeadError):
            futures.append(port._ref.stop(block=False))
    for f in futures:
        with contextlib.suppress(pykka.Timeout, pykka.ActorDeadError):
            f.get(timeout=timeout)
    for port in ports:
        port.conn.stop()
        port.sockets.close()
