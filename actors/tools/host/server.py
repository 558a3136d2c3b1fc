"""The request loop of a tool host: a ROUTER socket, a worker thread per running call.

The main thread owns the socket and never runs a tool: it answers ``Hello`` with the tool
list and ``Ping`` with ``Pong`` at once, checks each ``ToolRequest`` (known tool, arguments
valid against its JSON schema, approval) and hands it to a worker thread, with at most
``max_calls`` tools running at a time (a call over the cap is answered ``Failed`` at once
rather than queued behind a slow tool). Workers post their answers to the main thread's
loop (:class:`actors.wire.loop.Loop`), which sends them. A call that passes its timeout is answered
``Failed`` and told to stop (a tool with a subprocess kills its whole process tree).

A worker still running ``STUCK_S`` after its call was told to stop is stuck for good (a
Python thread cannot be killed): from then on the host answers ``Ping`` with ``Unhealthy``
and every call with the reason, and the supervisor restarts it.

A frame that is not a valid message is answered ``Failed`` (or dropped, when libzmq already
cut off a peer over ``MAXMSGSIZE``) and logged, at a bounded rate; nothing a peer sends
can end the host.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import psutil
import zmq

from actors.base import telemetry
from actors.base.errors import UsageError, WireError
from actors.base.processes.trees import kill_tree
from actors.base.textcut import cut
from actors.tools.protocol import wire
from actors.tools.protocol.argcheck import ArgumentCheck
from actors.tools.protocol.provider import (
    APPROVED_LANDING,
    ASK,
    FREE_CPUS,
    PROGRESS,
    Asker,
    Reporter,
    ToolProvider,
    landing_of,
)
from actors.tools.protocol.spec import ToolSpec
from actors.tools.protocol.wire import (
    Cancel,
    Failed,
    Hello,
    PendingApproval,
    Ping,
    Pong,
    Result,
    ToolRequest,
)
from actors.wire.complaints import Complaints
from actors.wire.loop import Loop, Timer
from actors.wire.peer_guard import short

__all__ = ["HOST_GRACE_S", "STUCK_S", "Complaints", "Host", "home_cpu", "pin"]

log = logging.getLogger("loopd.toolhost")

# The host gives a tool this long past its timeout to answer for itself (a tool's own
# "timed out" answer says more than the host's) before answering Failed in its place.
HOST_GRACE_S = 0.25
# A worker still running this long after its call was answered "did not finish" and told to
# stop is stuck (a tool that ignores cancel, a read that never returns): the host is unhealthy.
STUCK_S = 5.0
_PARENT_CHECK_S = 0.25
_MAX_PEERS = 1024  # ports remembered to tell of a new tool list (each daemon has one per host)
_AWAIT_S = 0.0005  # how long the loop waits on a lone call before polling again


@dataclasses.dataclass(slots=True)
class _Tool:
    spec: ToolSpec
    provider: ToolProvider
    check: ArgumentCheck
    allowed: bool = False  # named by --allow: runs unasked, but for a protected write


@dataclasses.dataclass(slots=True, eq=False)
class _Call:
    peer: bytes
    id: int
    tool: str
    deadline: float
    cancel: threading.Event = dataclasses.field(default_factory=threading.Event)
    landing: str | None = None  # where it was approved to write (APPROVED_LANDING)
    traceparent: str = ""  # the caller's execute_tool span: this run's span joins its trace
    ask_s: float = 0.0  # how long the caller waits for the person's answer (0: nobody asks)
    progress: bool = False  # the caller wants its progress (wire: progress)
    asking: int = 0  # questions open: the call's clock stops while the person thinks
    latest: float = 0.0  # the most its deadline may move to on progress (0: not at all)


@dataclasses.dataclass(slots=True, eq=False)
class _Question:
    """A question a running call asked the person (wire: ``ask``), until its ``reply``."""

    done: threading.Event = dataclasses.field(default_factory=threading.Event)
    reply: wire.Reply | None = None


# The answer's kind on the host's span (a str or a Result is a result).
_OUTCOMES = {Failed: "failed", wire.Denied: "denied", PendingApproval: "pending_approval"}


class Host:
    """The request loop of one tool host, on a ROUTER socket made by the caller."""

    def __init__(
        self,
        providers: list[ToolProvider],
        *,
        name: str,
        allow: frozenset[str] = frozenset(),
        timeout_s: float = 60.0,
        max_calls: int = 8,
        max_frame_bytes: int = wire.DEFAULT_MAX_FRAME,
        cpu: int | None = None,
    ) -> None:
        self.name = name
        self.timeout_s = timeout_s
        self.max_calls = max_calls
        self.max_frame = max_frame_bytes
        self._allow = allow
        self.tools = self._tool_table(providers)
        self.providers = providers
        self._tools_frame = wire.encode(wire.Tools(tuple(t.spec for t in self.tools.values())))
        self._peers: set[bytes] = set()  # those that said hello: told when the tools change
        self._active: dict[tuple[bytes, int], _Call] = {}
        self._running = 0  # worker threads busy, including ones past their deadline
        self._busy: set[_Call] = set()  # their calls (to see the stuck ones)
        self._unhealthy = ""  # why, once a worker is stuck (logged once)
        self._sock: zmq.Socket[Any] | None = None  # serve's
        self._loop = Loop()
        self._loop.linger = self._linger
        self._expiry: Timer | None = None  # at the earliest deadline of the calls running
        self._jobs: queue.SimpleQueue[tuple[_Call, _Tool, Mapping[str, Any]] | None] = (
            queue.SimpleQueue()
        )
        self._threads = 0
        # The CPU the loop and the workers keep to, and all of the process's (see home_cpu).
        self._home = {cpu} if cpu is not None else None
        self._free = os.sched_getaffinity(0) if cpu is not None else None
        self._complain = Complaints()
        self._questions: dict[tuple[bytes, int, int], _Question] = {}  # (peer, call, question)
        self._asked = itertools.count(1)  # question numbers (unique within the host)

    # --- control -------------------------------------------------------------------------

    def request_stop(self) -> None:
        """Ask :meth:`serve` to return (safe from a signal handler or another thread)."""
        self._loop.stop()

    # --- the loop ------------------------------------------------------------------------

    def serve(
        self, sock: zmq.Socket[Any], *, parent_alive: Callable[[], bool] | None = None
    ) -> None:
        """Answer on ``sock`` until :meth:`request_stop` or the parent is gone; then clean up."""
        loop = self._loop
        self._sock = sock
        loop.add(sock, self._on_frames)
        if parent_alive is not None:
            loop.every(_PARENT_CHECK_S, self._check_parent, parent_alive)
        for provider in self.providers:
            watch = getattr(provider, "watch", None)  # e.g. an MCP server's tools/list_changed
            if callable(watch):
                watch(lambda: loop.post(self._retool))
        log.info(
            "serving %s on %s",
            ", ".join(self.tools) or "no tools",
            sock.getsockopt_string(zmq.LAST_ENDPOINT),
        )
        try:
            loop.run()
        finally:
            loop.remove(sock)
            self._shutdown()

    def _check_parent(self, parent_alive: Callable[[], bool]) -> None:
        if not parent_alive():
            log.warning("the process that started this host is gone; exiting")
            self._loop.stop()

    def _linger(self) -> float:
        """Wait a moment for the one call running to be answered: most tools are that quick.

        Waking from the loop's queue is cheaper than from poll(), and the worker need not
        wake the loop. A slow tool only holds the loop up for ``_AWAIT_S`` once.
        """
        return _AWAIT_S if self._running == 1 else 0.0

    def _on_frames(self, frames: list[bytes]) -> None:
        peer = frames[0]
        if len(frames) != 2:
            self._complain(
                "peer %s sent %d frames; one message is one frame", short(peer), len(frames) - 1
            )
            self._send(peer, Failed(0, f"tool host {self.name}: one message must be one frame"))
            return
        try:
            msg = wire.decode(frames[1], self.max_frame)
        except WireError as e:
            self._complain("bad frame from peer %s: %s", short(peer), e)
            self._send(
                peer,
                Failed(e.id or 0, f"tool host {self.name} could not read the message: {e}"),
            )
            return
        self._handle(peer, msg)

    def _tool_table(self, providers: Sequence[ToolProvider]) -> dict[str, _Tool]:
        tools: dict[str, _Tool] = {}
        for provider in providers:
            for spec in provider.specs():
                if spec.name in tools:
                    raise UsageError(f"two providers in tool host {self.name} offer {spec.name!r}")
                allowed = spec.needs_approval and spec.name in self._allow
                spec = dataclasses.replace(spec, needs_approval=spec.needs_approval and not allowed)
                try:
                    check = ArgumentCheck(spec.parameters)
                except UsageError as e:
                    raise UsageError(
                        f"tool {spec.name}: its argument schema is invalid: {e}"
                    ) from None
                tools[spec.name] = _Tool(spec, provider, check, allowed)
        return tools

    def _retool(self) -> None:
        """A provider's tools changed (an MCP server's tools/list_changed): the new list to
        every port that said hello (a port takes a ``tools`` message at any time)."""
        try:
            tools = self._tool_table(self.providers)
        except UsageError as e:
            log.warning("tool host %s: the new tool list is refused: %s", self.name, e)
            return
        self.tools = tools
        self._tools_frame = wire.encode(wire.Tools(tuple(t.spec for t in tools.values())))
        log.info("tool host %s: its tools changed (%d now)", self.name, len(tools))
        for peer in list(self._peers):
            self._send_frame(peer, self._tools_frame)

    def _handle(self, peer: bytes, msg: wire.Message) -> None:
        if isinstance(msg, Ping):
            why = self._stuck()
            self._send_frame(peer, _PONG if not why else wire.encode(wire.Unhealthy(why)))
        elif isinstance(msg, ToolRequest):
            self._start(peer, msg)
        elif isinstance(msg, Hello):
            if len(self._peers) < _MAX_PEERS:
                self._peers.add(peer)
            self._send_frame(peer, self._tools_frame)
        elif isinstance(msg, wire.Reply):
            question = self._questions.pop((peer, msg.id, msg.question), None)
            if question is not None:  # else it was given up on: the answer came too late
                question.reply = msg
                question.done.set()
        elif isinstance(msg, Cancel):
            call = self._active.pop((peer, msg.id), None)
            if call is not None:
                call.cancel.set()
                log.info("call %d (%s) cancelled by the caller", msg.id, call.tool)
        else:
            kind = type(msg).__name__
            self._complain("peer %s sent %s, which only a host sends", short(peer), kind)
            self._send(
                peer,
                Failed(getattr(msg, "id", 0), f"a tool host does not take {kind} messages"),
            )

    def _start(self, peer: bytes, req: ToolRequest) -> None:
        tool = self.tools.get(req.tool)
        if tool is None:
            known = ", ".join(self.tools) or "none"
            self._send(
                peer,
                Failed(req.id, f"tool host {self.name} has no tool {req.tool!r} (it has: {known})"),
            )
            return
        error = tool.check.problem(req.arguments)
        if error is not None:
            where, what = error
            self._send(
                peer,
                Failed(
                    req.id,
                    f"arguments of {req.tool} do not match its schema at {where}: {what}",
                ),
            )
            return
        pending = self._pending(tool, req)
        if pending is not None:
            self._send(peer, pending)
            return
        key = (peer, req.id)
        if key in self._active:
            self._send(peer, Failed(req.id, f"call id {req.id} is already running on this host"))
            return
        if self._unhealthy:
            self._send(peer, Failed(req.id, self._unhealthy))
            return
        if self._running >= self.max_calls:
            self._send(
                peer,
                Failed(
                    req.id,
                    f"tool host {self.name} is busy: {self._running} calls are running, the "
                    "most it runs at once (tools.max_concurrent_calls); try again when one "
                    "has finished",
                ),
            )
            return
        call = _Call(peer, req.id, req.tool, time.monotonic() + self.timeout_s + HOST_GRACE_S,
                     landing=req.landing if req.approved and req.landing else None,
                     traceparent=req.traceparent, ask_s=req.ask_s, progress=req.progress)
        if req.progress:
            call.latest = time.monotonic() + wire.PROGRESS_MAX_TIMES * self.timeout_s
        self._active[key] = call
        self._expire_at(call.deadline)
        self._busy.add(call)
        self._running += 1
        if self._threads < self._running:  # every thread may be busy: add one (<= max_calls)
            self._threads += 1
            threading.Thread(target=self._worker, name=f"tool-{self._threads}", daemon=True).start()
        self._jobs.put((call, tool, req.arguments))

    def _pending(self, tool: _Tool, req: ToolRequest) -> PendingApproval | None:
        """The answer to a call that must wait for approval, None when it may run: one not
        approved (unless --allow names it); a write that lands in a protected place, unless
        approved for exactly there; an approved write that no longer lands where it was
        seen to (wire: where a write lands)."""
        if not (tool.spec.needs_approval or tool.allowed):
            return None
        try:
            landing, protected = landing_of(tool.provider, req.tool, req.arguments)
        except Exception as e:  # a path the tool's own walk refuses: it will say why
            log.debug("no landing for %s: %s", req.tool, e)
            landing, protected = "", ""
        if protected:
            if req.approved and req.landing == landing:
                return None
        elif not req.approved:
            if tool.allowed:
                return None
        elif not req.landing or req.landing == landing:
            return None
        args = json.dumps(req.arguments, ensure_ascii=False)
        lands = f" It writes {landing}." if landing and landing != req.arguments.get("path") else ""
        hint = (f" {protected}." if protected else " (To let it run without asking, add "
                f'"{req.tool}" to tools.allow in the config.)')
        prompt = f"Allow {req.tool} to run with {args[:500]}?{lands}{hint}"
        return PendingApproval(req.id, prompt, landing, protected)

    def _worker(self) -> None:
        """A worker thread: runs calls one after another until it gets None.

        It keeps to the loop's CPU (``cpu``, see :func:`home_cpu`): each hand-off stays on
        one CPU. A process a tool starts gets every CPU (``FREE_CPUS``, through
        :func:`~actors.tools.protocol.provider.starting_process`): changing the thread's
        CPUs around every call instead cost two system calls of ~12 us each per call, half
        of what the host adds to a bare round trip.
        """
        pin(self._home)
        if self._home is not None and self._free is not None:
            FREE_CPUS.set(frozenset(self._free))
        while (job := self._jobs.get()) is not None:
            self._work(*job)

    def _work(self, call: _Call, tool: _Tool, arguments: Mapping[str, Any]) -> None:
        """Runs in a worker thread: the tool, then its answer encoded for the main thread."""
        approved = APPROVED_LANDING.set(call.landing)
        asker = ASK.set(self._asker(call) if call.ask_s > 0 else None)
        reporter = PROGRESS.set(self._reporter(call) if call.progress else None)
        with telemetry.span(f"run_tool {call.tool}", {"gen_ai.tool.name": call.tool,
                            "loopd.toolhost": self.name}, kind="server",
                            parent=call.traceparent) as span:
            try:
                answer = tool.provider.run(call.tool, arguments, self.timeout_s, call.cancel)
            except BaseException as e:  # a tool must not take its worker (or the host) down
                log.warning("tool %s raised %s: %s", call.tool, type(e).__name__, e)
                answer = Failed(message=f"{call.tool} failed: {type(e).__name__}: {e}")
            finally:
                APPROVED_LANDING.reset(approved)
                ASK.reset(asker)
                PROGRESS.reset(reporter)
            span.set("loopd.tool.outcome", _OUTCOMES.get(type(answer), "result"))
        try:
            frame = self._frame(call, tool.spec, answer)
        except Exception as e:  # pragma: no cover - a bug here must not lose the call
            log.exception("could not encode the answer of %s", call.tool)
            frame = wire.encode(Failed(call.id, f"{call.tool}: the answer could not be sent: {e}"))
        # last: the main thread wants the interpreter lock right after this
        self._loop.post(self._answered, call, frame)

    def _asker(self, call: _Call) -> Asker:
        """What a provider running ``call`` asks the person through (wire: ``ask``)."""
        return _HostAsker(self, call)

    def _reporter(self, call: _Call) -> Reporter:
        """What a provider running ``call`` reports its progress through (wire: progress)."""

        def report(done: float, total: float | None, message: str) -> None:
            self._loop.post(self._progress, call, wire.Progress(call.id, float(done),
                                                               float(total or 0.0), message))

        return report

    def _progress(self, call: _Call, msg: wire.Progress) -> None:
        """Send it on, and give the call a whole limit from now (up to ``latest``)."""
        if self._active.get((call.peer, call.id)) is call:  # not after its answer
            moved = min(time.monotonic() + self.timeout_s + HOST_GRACE_S, call.latest)
            call.deadline = max(call.deadline, moved)
            self._send(call.peer, msg)

    def _ask(
        self, key: tuple[bytes, int, int], question: _Question, call: _Call, msg: wire.Ask
    ) -> None:
        self._questions[key] = question
        call.asking += 1
        self._send(key[0], msg)

    def _asked_done(self, key: tuple[bytes, int, int], call: _Call, waited: float) -> None:
        """The question is over: the call's clock runs again, the time asked not counted."""
        self._questions.pop(key, None)
        call.asking -= 1
        call.deadline += waited
        if self._active.get((call.peer, call.id)) is call:
            self._expire_at(call.deadline)

    def _frame(self, call: _Call, spec: ToolSpec, answer: Any) -> bytes:
        """The answer as a frame with the call's id, cut to fit in one frame."""
        if isinstance(answer, str):
            answer = Result(call.id, answer, spec.result_class, spec.untrusted)
        elif isinstance(answer, Result):
            untrusted = answer.untrusted or spec.untrusted
            answer = Result(call.id, answer.content, answer.class_, untrusted)
        elif isinstance(answer, Failed | wire.Denied | PendingApproval):
            answer = dataclasses.replace(answer, id=call.id)
        else:
            answer = Failed(
                call.id,
                f"{call.tool} returned {type(answer).__name__}, not an answer "
                "(a bug in its provider)",
            )
        try:
            frame = wire.encode(answer)
        except WireError:
            if not isinstance(answer, Result) or not isinstance(answer.content, str):
                return wire.encode(
                    Failed(call.id, f"{call.tool} gave an answer that cannot be sent")
                )
            clean = answer.content.encode("utf-8", "replace").decode("utf-8")
            frame = wire.encode(dataclasses.replace(answer, content=clean))
        if len(frame) > self.max_frame and isinstance(answer, Result):
            room = self.max_frame - 4096
            kept, _, _ = cut(answer.content, room, "bytes")
            note = f"\n[cut by the tool host: over the frame limit of {self.max_frame} bytes]"
            frame = wire.encode(dataclasses.replace(answer, content=kept + note))
        if len(frame) > self.max_frame:
            frame = wire.encode(Failed(call.id, f"{call.tool}'s answer is too large to send"))
        return frame

    def _stuck(self) -> str:
        """Why this host is unhealthy ("" while every worker comes back in time)."""
        if self._unhealthy:
            return self._unhealthy  # a stuck worker is stuck for good: only a restart helps
        now = time.monotonic()
        stuck = sorted(
            (c for c in self._busy if now > c.deadline + STUCK_S and not c.asking),
            key=lambda c: c.deadline,
        )
        if not stuck:
            return ""
        calls = "1 call" if len(stuck) == 1 else f"{len(stuck)} calls"
        tools = ", ".join(dict.fromkeys(c.tool for c in stuck))
        self._unhealthy = (
            f"tool host {self.name} is unhealthy: {calls} did not come back ({tools}, more "
            f"than {STUCK_S:g} s after being told to stop); it needs a restart"
        )
        log.error("%s", self._unhealthy)
        return self._unhealthy

    def _answered(self, call: _Call, frame: bytes) -> None:
        self._busy.discard(call)
        self._running -= 1
        if self._active.get((call.peer, call.id)) is call:
            del self._active[(call.peer, call.id)]
            self._send_frame(call.peer, frame)

    def _expire(self) -> None:
        """At the earliest deadline: answer every late call Failed and tell it to stop."""
        self._expiry = None
        now = time.monotonic()
        late = [c for c in self._active.values() if c.deadline <= now and not c.asking]
        for call in late:
            del self._active[(call.peer, call.id)]
            call.cancel.set()
            log.warning(
                "call %d (%s) passed the %g s limit; told to stop",
                call.id,
                call.tool,
                self.timeout_s,
            )
            self._send(
                call.peer,
                Failed(
                    call.id,
                    f"{call.tool} did not finish within {self.timeout_s:g} s (the tool host's "
                    "limit, tools.timeout_s); it was stopped",
                ),
            )
        running = [c.deadline for c in self._active.values() if not c.asking]
        if running:  # a call asking the person is re-armed when its question is over
            self._expire_at(min(running))

    def _expire_at(self, deadline: float) -> None:
        if self._expiry is None or deadline < self._expiry.when:
            self._loop.cancel(self._expiry)
            self._expiry = self._loop.call_at(deadline, self._expire)

    def _send(self, peer: bytes, msg: wire.Message) -> None:
        self._send_frame(peer, wire.encode(msg))

    def _send_frame(self, peer: bytes, frame: bytes) -> None:
        assert self._sock is not None
        try:
            self._sock.send_multipart([peer, frame], zmq.NOBLOCK)
        except zmq.Again:
            log.warning("peer %s is not reading; an answer was dropped", short(peer))
        except zmq.ZMQError as e:  # EHOSTUNREACH (ROUTER_MANDATORY): the peer is gone
            log.info("peer %s is gone (%s); an answer was dropped", short(peer), e)

    def _shutdown(self) -> None:
        """Stop every running tool (and its processes), then close the providers."""
        for call in self._active.values():
            call.cancel.set()
        self._active.clear()
        for _ in range(self._threads):
            self._jobs.put(None)
        deadline = time.monotonic() + 2.0  # their answers are posted: nobody to send them to
        while self._running > 0 and time.monotonic() < deadline:
            self._loop.run_once(0.05)
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process().children():
                kill_tree(child.pid, wait_s=0.5)
        for provider in self.providers:
            try:
                provider.close()
            except Exception as e:
                log.warning("closing a provider failed: %s", e)
        self._loop.close()


class _HostAsker:
    """A running call's :class:`~actors.tools.protocol.provider.Asker` (wire: ``ask``)."""

    def __init__(self, host: Host, call: _Call) -> None:
        self.host, self.call = host, call
        self.budget_s = call.ask_s + HOST_GRACE_S  # the reply's trip back included

    def __call__(
        self, server: str, message: str, schema: Mapping[str, Any]
    ) -> tuple[str, dict[str, Any]]:
        host, call = self.host, self.call
        question = _Question()
        number = next(host._asked)  # count's next is atomic: workers ask at once
        key = (call.peer, call.id, number)
        start = time.monotonic()
        host._loop.post(host._ask, key, question, call,
                        wire.Ask(call.id, number, server, message, dict(schema)))
        while not question.done.wait(0.05):
            if call.cancel.is_set() or time.monotonic() >= start + self.budget_s:
                break
        host._loop.post(host._asked_done, key, call, time.monotonic() - start)
        reply = question.reply
        if reply is None or reply.action not in wire.ACTIONS:
            log.info("call %d (%s): the question %r got no answer", call.id, call.tool,
                     message[:80])
            return "cancel", {}
        return reply.action, dict(reply.content) if reply.action == "accept" else {}


_PONG = wire.encode(Pong())


def home_cpu() -> int | None:
    """A CPU for the host's loop, spread over hosts by pid; None where pinning does not apply.

    Every call is handed from the loop to a worker thread and back, and libzmq's I/O thread
    sits between the loop and the socket. When these threads are on different CPUs each
    hand-off is a cross-CPU wake-up, which on a VM costs more than the socket round trip;
    the GIL runs one of them at a time anyway. What tools start runs free (see ``_worker``).
    """
    if not hasattr(os, "sched_setaffinity"):
        return None
    cpus = sorted(os.sched_getaffinity(0))
    return cpus[os.getpid() % len(cpus)] if len(cpus) > 1 else None


def pin(cpus: set[int] | None) -> None:
    """Keep the calling thread (and threads and processes it starts) to ``cpus``."""
    if cpus is not None:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, cpus)
