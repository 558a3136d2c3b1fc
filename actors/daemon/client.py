"""The Python client of ``loopd serve``: what the CLI (and any script) uses to reach it.

::

    with Client.from_config(config) as client:
        turn = client.turn("notes", "What does notes.txt say?")
        for event in turn:          # the turn's events, as they happen
            ...
        print(turn.outcome.content)

The DEALER socket and its loop (:class:`actors.wire.loop.Loop`) are used by one thread at a
time (ZeroMQ sockets are not thread-safe; a lock hands them from thread to thread): the
thread waiting for an answer polls the socket itself, routes each message to the request it
belongs to by ``id``, and so reads its turn's events without a hop through another thread
(on a machine where waking a thread is dear, each hop was ~2 context switches a message).
A thread that sends while another holds the socket posts its message to the loop, which the
holder sends before it lets go. A thread of the client's own takes the socket whenever no
caller holds it, every quarter ``daemon.heartbeat_s``, and pings the daemon every
``daemon.heartbeat_s`` whatever the caller is doing (reading events slowly, or a person
thinking about an approval), so the daemon never takes a busy client for a gone one. A
daemon silent for three heartbeats is gone: every request waiting raises
:class:`~actors.base.errors.DaemonError`. An ``error`` answer raises the LoopdError of the
same name and exit code (``SessionInUse``, ``Cancelled``, ``TurnLimit``...), so the CLI
shows a failure through the daemon the way it shows one in-process.

The protocol is documented in :mod:`actors.daemon.protocol`.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
import queue
import threading
import time
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Any, TypeVar

import zmq

from actors.base import errors, telemetry
from actors.base.cancel import CancelToken, wait_out
from actors.base.config import Config
from actors.base.errors import DaemonError, LoopdError, WireError
from actors.base.events import NO_APPROVER, ApprovalRequested, Approver, Choice, Decision, Event
from actors.daemon import protocol as p
from actors.daemon.address import endpoint as daemon_endpoint
from actors.daemon.address import may_answer
from actors.log.records import Record, Usage
from actors.log.records import decode as decode_record
from actors.service.types import (
    CompactReport,
    Forked,
    McpServer,
    Opened,
    Rewound,
    TurnOutcome,
)
from actors.wire.loop import Heartbeat, Loop
from actors.wire.peer_guard import new_routing_id

__all__ = ["Client", "CurveKeys", "RemoteTurn", "find_daemon", "remote_error"]

R = TypeVar("R")
CurveKeys = tuple[bytes, bytes, bytes]  # the daemon's public key, our public and secret keys


class _Gone:
    def __init__(self, why: str) -> None:
        self.why = why


class Client:
    """One connection to a daemon; a context manager. Thread-safe."""

    def __init__(
        self, endpoint: str, *, curve: CurveKeys | None = None, heartbeat_s: float = 1.0,
        max_frame_bytes: int = 4 * 1024 * 1024,
    ) -> None:  # fmt: skip
        self.endpoint = endpoint
        self.heartbeat_s = heartbeat_s
        self.max_frame = max_frame_bytes
        self._ctx: zmq.Context[Any] = zmq.Context()
        self._sock: zmq.Socket[Any] = self._ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.MAXMSGSIZE, max_frame_bytes)
        self.routing_id = new_routing_id()  # its own: none the daemon's socket counts out
        self._sock.setsockopt(zmq.ROUTING_ID, self.routing_id)
        if curve is not None:
            self._sock.curve_serverkey, self._sock.curve_publickey, self._sock.curve_secretkey = (
                curve
            )
        self._sock.connect(endpoint)
        self._ids = itertools.count(1)
        self._waiting: dict[int, queue.SimpleQueue[Any]] = {}
        self._pongs: list[queue.SimpleQueue[Any]] = []
        self._tokens: dict[int, CancelToken] = {}  # per turn: set on its end or the daemon's
        self._lock = threading.Lock()
        self._idle: set[queue.SimpleQueue[Any]] = set()  # waiting while another holds the socket
        self.gone: str | None = None
        # Held by the thread using the socket and the loop now (never across a wait of the
        # caller's own: only while polling, at most _POLL_S, or sending).
        self._holding = threading.Lock()
        self._closed = False  # the socket is closed (set holding it)
        self._stopped = threading.Event()  # the keeper's wait: set by close() or the silence
        self._loop = Loop()
        self._loop.add(self._sock, self._on_frames)
        self._heartbeat = Heartbeat(
            self._loop, heartbeat_s, self._silent, ping=functools.partial(self._put, _PING)
        )
        self._thread = threading.Thread(target=self._keep, name="loopd-client", daemon=True)
        self._thread.start()

    @classmethod
    def from_config(cls, config: Config) -> Client:
        """A client of the daemon that ``config``'s ``[daemon]`` names."""
        d = config.daemon
        curve = None
        if d.server_key or d.client_key:
            from actors.wire.curve import load_public, load_secret

            if not (d.server_key and d.client_key):
                raise errors.ConfigError(
                    "daemon.server_key and daemon.client_key go together (the daemon's public "
                    "key and this client's .key_secret file)"
                )
            public, secret = load_secret(d.client_key)
            curve = (load_public(d.server_key), public, secret)
        return cls(
            daemon_endpoint(config), curve=curve, heartbeat_s=d.heartbeat_s,
            max_frame_bytes=d.max_frame_bytes,
        )  # fmt: skip

    # --- requests ----------------------------------------------------------------------

    def ping(self, timeout: float) -> bool:
        """True when the daemon answers a ping within ``timeout`` seconds; raises the
        daemon's refusal (e.g. it serves ``daemon.max_clients`` clients already)."""
        q: queue.SimpleQueue[Any] = queue.SimpleQueue()
        with self._lock:
            self._pongs.append(q)
        self._send(_PING)
        try:
            answer = self._wait(q, time.monotonic() + timeout)
        except queue.Empty:
            return False
        finally:
            with self._lock, contextlib.suppress(ValueError):
                self._pongs.remove(q)
        if isinstance(answer, p.Error):
            raise remote_error(answer)
        return not isinstance(answer, _Gone)

    def call(self, request: Callable[[int], p.Message], kind: type[R]) -> R:
        """Send ``request(id)``; the session service's result of type ``kind`` its answer
        carries (actors.daemon.protocol.result): how an operation of the service crosses
        the wire, whatever its message (actors.service.remote)."""
        return p.result(kind, self._ask(request, p.REPLIES[kind]))

    def open(self, session: str, create: bool = True,
             servers: tuple[McpServer, ...] = ()) -> Opened:
        """Attach ``session`` to this client (created when missing and ``create``), with
        ``servers``, its own MCP servers, started in the daemon."""
        return self.call(lambda rid: p.Open(rid, session, create, servers), Opened)

    def close_session(self, session: str) -> None:
        self._ask(lambda rid: p.Close(rid, session), p.Ok)

    def sessions(self) -> list[str]:
        answer: p.SessionList = self._ask(p.Sessions, p.SessionList)
        return list(answer.names)

    def read_log(self, session: str) -> list[Record]:
        """Every record of ``session``, the Baseline first."""
        records: list[Record] = []
        start = 0
        while True:
            ask = functools.partial(_read_log, session=session, start=start)
            page: p.Log = self._ask(ask, p.Log)
            records.extend(decode_record(blob) for blob in page.records)
            if page.done:
                return records
            start = page.next

    def fork(self, source: str, session: str, at: int | None = None) -> Forked:
        """Make ``session`` a fork of ``source`` (up to the end of its turn ``at``; all by
        default), starting from its KV state (docs/rendering.md#fork-and-rewind)."""
        return self.call(lambda rid: p.Fork(rid, source, session, at), Forked)

    def rewind(self, session: str, turns: int = 1) -> Rewound:
        """Take back ``session``'s last ``turns`` turns (they stay in its log); refused
        while another client has it attached (SessionInUse) or a turn runs on it."""
        return self.call(lambda rid: p.Rewind(rid, session, turns), Rewound)

    def compact(self, session: str) -> CompactReport:
        """Compact ``session``'s conversation now (docs/rendering.md#compaction)."""
        return self.call(lambda rid: p.Compact(rid, session), CompactReport)

    def remove(self, session: str) -> None:
        """Delete ``session`` (its log and saved KV state); refused while it is attached."""
        self._ask(lambda rid: p.Remove(rid, session), p.Ok)

    def status(self) -> p.StatusReply:
        answer: p.StatusReply = self._ask(p.Status, p.StatusReply)
        return answer

    def stop(self) -> None:
        """Ask the daemon to stop (it cancels its turns, saves KV state, stops its hosts)."""
        self._ask(p.Stop, p.Ok)

    def turn(
        self, session: str, text: str, on_approval: Approver | None = None,
        approve: tuple[str, ...] = (),
    ) -> RemoteTurn:
        """Start a turn; iterate the result for its events, then read its ``outcome``.

        ``on_approval`` answers the calls that need the person's approval, with the same
        interface as in-process (:class:`actors.approval.gate.Approver`: the request, a cancel
        token set when the turn ends or the daemon goes, a deadline); it is called in the
        thread that iterates. Without one, such calls are denied (nobody to ask).
        ``approve``: allow rules for this turn only (``loopd run --approve``)."""
        rid, answers = self._request(
            lambda r: p.Turn(r, session, text, approve, telemetry.traceparent(), batch=True))
        return RemoteTurn(self, rid, answers, on_approval)

    def _request(self, make: Callable[[int], Any]) -> tuple[int, queue.SimpleQueue[Any]]:
        rid = next(self._ids)
        answers: queue.SimpleQueue[Any] = queue.SimpleQueue()
        with self._lock:
            if self.gone is not None:
                raise DaemonError(self.gone)
            self._waiting[rid] = answers
        self._send(p.encode(make(rid)))
        return rid, answers

    def _ask(self, make: Callable[[int], Any], expect: type[Any]) -> Any:
        rid, answers = self._request(make)
        try:
            answer = self._wait(answers)
        finally:
            self._forget(rid)
        if isinstance(answer, _Gone):
            raise DaemonError(answer.why)
        if isinstance(answer, p.Error):
            raise remote_error(answer)
        if not isinstance(answer, expect):
            raise WireError(f"the daemon answered {type(answer).__name__} to a request")
        return answer

    def _forget(self, rid: int) -> None:
        with self._lock:
            self._waiting.pop(rid, None)
            self._tokens.pop(rid, None)

    def _token(self, rid: int) -> CancelToken:
        token = CancelToken()
        with self._lock:
            if self.gone is not None:
                token.cancel()
            self._tokens[rid] = token
        return token

    def _send(self, frame: bytes) -> None:
        """Send ``frame`` now when the socket is free, else hand it to its holder; in the
        order of this thread's sends either way (what was posted before leaves first)."""
        if self._holding.acquire(blocking=False):
            try:
                self._loop.run_posted()
                self._put(frame)
            finally:
                self._let_go()
            return
        self._loop.post(self._put, frame)  # the holder's poll wakes for it
        if self._holding.acquire(blocking=False):  # it let go meanwhile, maybe before looking
            try:
                self._loop.run_posted()
            finally:
                self._let_go()

    def _wait(self, answers: queue.SimpleQueue[Any], deadline: float = math.inf) -> Any:
        """The next answer in ``answers``, polling the socket in this thread while no other
        holds it (raises queue.Empty at ``deadline``). In waits of at most :data:`_POLL_S`,
        so that Ctrl-C reaches the caller."""
        while True:
            with contextlib.suppress(queue.Empty):
                while (msg := answers.get_nowait()) is _NUDGE:
                    pass
                return msg
            wait = min(_POLL_S, deadline - time.monotonic())
            if wait <= 0:
                raise queue.Empty
            if self._poll(wait):
                continue
            with self._lock:
                self._idle.add(answers)
            try:
                if self._poll(wait):  # let go before this thread was seen waiting
                    continue
                msg = answers.get(timeout=wait)  # its holder's, who nudges it on letting go
            except queue.Empty:
                continue
            finally:
                with self._lock:
                    self._idle.discard(answers)
            if msg is not _NUDGE:
                return msg

    def _poll(self, wait: float) -> bool:
        """Poll the socket for up to ``wait`` seconds, unless another thread holds it (False)."""
        if not self._holding.acquire(blocking=False):
            return False
        try:
            if self._closed:  # the waiting queues hold the reason already
                time.sleep(min(wait, 0.01))
            else:
                self._loop.run_once(wait)
        finally:
            self._let_go()
        return True

    def _let_go(self) -> None:
        """Release the socket; run what was posted meanwhile; nudge the threads waiting."""
        self._holding.release()
        while self._loop.pending() and self._holding.acquire(blocking=False):
            try:
                self._loop.run_posted()
            finally:
                self._holding.release()
        if self._idle:
            with self._lock:
                idle = list(self._idle)
            for q in idle:
                q.put(_NUDGE)

    # --- the keeper thread: heartbeats while no caller holds the socket -------------------

    def _keep(self) -> None:
        tick = self.heartbeat_s / 4
        try:
            while not self._loop.stopping:
                self._poll(0)  # the timers due, what came meanwhile, what was posted
                self._stopped.wait(tick)  # until close(), or the daemon's silence
        finally:
            with self._holding:
                self._heartbeat.cancel()
                if self.gone is None:
                    self._end("the client was closed")
                self._loop.run_posted()  # the bye
                self._closed = True
                self._sock.close(linger=_LINGER_MS)  # the bye, at least, may still leave

    def _put(self, frame: bytes) -> None:
        if self._closed:
            return
        with contextlib.suppress(zmq.Again):  # not connected yet: heartbeats decide
            self._sock.send(frame, zmq.NOBLOCK)

    def _silent(self, silence: float) -> None:
        self._end(f"the loopd daemon at {self.endpoint} stopped answering "
                  f"(nothing for {silence:.1f} s)")  # fmt: skip
        self._loop.stop()
        self._stopped.set()

    def _on_frames(self, frames: list[bytes]) -> None:
        self._heartbeat.heard()
        for frame in frames:
            self._deliver(frame)

    def _deliver(self, frame: bytes) -> None:
        try:
            msg = p.decode(frame, self.max_frame)
        except WireError as e:
            msg = p.Error(e.id or 0, "WireError", f"the daemon sent a bad message: {e}", 1)
            if e.id is None:
                return
        if isinstance(msg, p.Pong) or (isinstance(msg, p.Error) and msg.id == 0):
            with self._lock:  # an error of no request: the daemon refuses this client
                pongs = list(self._pongs)
            for q in pongs:
                q.put(msg)
            return
        rid = getattr(msg, "id", -1)
        with self._lock:
            target = self._waiting.get(rid)
            token = self._tokens.get(rid) if isinstance(msg, p.Error | p.Done) else None
        if target is not None:
            target.put(msg)
        if token is not None:  # an approver still asking the person stops asking
            token.cancel()

    def _end(self, why: str) -> None:
        with self._lock:
            self.gone = why
            waiting = [*self._waiting.values(), *self._pongs]
            tokens = list(self._tokens.values())
        for q in waiting:
            q.put(_Gone(why))
        for token in tokens:
            token.cancel()

    def close(self) -> None:
        """Stop the keeper thread and close the socket; the daemon detaches this client's
        sessions."""
        if self._thread.is_alive():
            self._send(_BYE)
        self._loop.stop()
        self._stopped.set()
        self._thread.join(10)
        self._loop.close()
        self._ctx.term()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class RemoteTurn:
    """A turn running in the daemon: iterate it for its events; then :attr:`outcome`.

    Iterating raises the turn's LoopdError (Cancelled, TurnLimit...) when it ends without
    an answer. :meth:`cancel` cancels it (Ctrl-C); the events up to the end still come.
    """

    def __init__(
        self, client: Client, rid: int, answers: queue.SimpleQueue[Any],
        on_approval: Approver | None,
    ) -> None:  # fmt: skip
        self.client, self.id, self._answers, self._on_approval = client, rid, answers, on_approval
        self.outcome: TurnOutcome | None = None
        self.ended = client._token(rid)  # set when the turn ends or the daemon goes

    def cancel(self) -> None:
        self.client._send(p.encode(p.Cancel(self.id)))

    def __iter__(self) -> Iterator[Event]:
        try:
            while (event := self._step()) is not None:
                yield event
        finally:
            self._finish()

    def _step(self) -> Event | None:
        """The turn's next event; None once it answered (``outcome`` set); raises its error.

        Ctrl-C while waiting here leaves the turn as it was: the caller may cancel, and
        step on to its end."""
        while True:
            msg = self.client._wait(self._answers)
            if isinstance(msg, p.EventMessage):
                return p.decode_event(msg)
            if isinstance(msg, p.Done):
                self.outcome = _outcome(msg)
                return None
            if isinstance(msg, p.Approval):
                self._approve(msg)
            elif isinstance(msg, p.Error):
                raise remote_error(msg)
            elif isinstance(msg, _Gone):
                raise DaemonError(msg.why)

    def _finish(self) -> None:
        self.ended.cancel()
        self.client._forget(self.id)

    def _approve(self, msg: p.Approval) -> None:
        """Ask ``on_approval`` as the in-process turn would, and send its answer (if any)."""
        request = ApprovalRequested(
            call=msg.call, tool=msg.tool, arguments=msg.arguments, prompt=msg.prompt,
            rule=msg.rule, timeout_s=msg.timeout_s, child=msg.child,
        )  # fmt: skip
        if self._on_approval is None:
            decision: Decision | None = Decision(Choice.DENY, NO_APPROVER, by="no approver")
        else:
            deadline = time.monotonic() + msg.timeout_s if msg.timeout_s > 0 else math.inf
            decision = self._on_approval(request, self.ended, deadline)
        if decision is not None:  # None: no answer; the daemon's wait ends by itself
            answer = p.Approve(self.id, msg.call, decision.choice, decision.reason, decision.by)
            self.client._send(p.encode(answer))

    def run(self, sink: Callable[[Event], None]) -> TurnOutcome:
        """Pass every event to ``sink``; the outcome. Ctrl-C cancels, and waits for the end.

        A subclass of KeyboardInterrupt (the CLI's SIGTERM) cancels the same way and is
        raised again once the turn has ended, so it ends the caller's command too."""

        def step() -> TurnOutcome | None:
            event = self._step()
            if event is None:
                return self.outcome
            sink(event)
            return None

        try:
            return wait_out(step, self.cancel)
        finally:
            self._finish()


def _read_log(rid: int, *, session: str, start: int) -> p.ReadLog:
    return p.ReadLog(rid, session, start)


def _outcome(msg: p.Done) -> TurnOutcome:
    usage = decode_record(msg.usage)
    if not isinstance(usage, Usage):
        raise WireError(f"done.usage: expected a usage record, got {type(usage).__name__}", msg.id)
    return TurnOutcome(
        content=msg.content, usage=usage, iterations=msg.iterations,
        tool_calls=msg.tool_calls, cut=msg.cut, restored=msg.restored, context=msg.context,
        compactions=msg.compactions,
    )  # fmt: skip


_BY_EXIT = {2: errors.UsageError, 3: errors.LimitError, 4: errors.ServerError,
            5: errors.SessionError, 130: errors.Cancelled}  # fmt: skip
_MADE: dict[str, type[LoopdError]] = {}


def remote_error(msg: p.Error) -> LoopdError:
    """The LoopdError an ``error`` answer names: its class when this side has it (else one
    of that name under the class of its exit code), its message, its exit code."""
    cls = getattr(errors, msg.error, None)
    if not (isinstance(cls, type) and issubclass(cls, LoopdError)):
        cls = _MADE.get(msg.error)
        if cls is None:
            base = _BY_EXIT.get(msg.exit_code, LoopdError)
            name = msg.error if msg.error.isidentifier() else "RemoteError"
            cls = _MADE[msg.error] = type(name, (base,), {"exit_code": msg.exit_code})
    error: LoopdError = BaseException.__new__(cls)
    BaseException.__init__(error, msg.message)
    return error


_PING, _BYE = p.encode(p.Ping()), p.encode(p.Bye())
_NUDGE = object()  # put in a waiting thread's queue: the socket is free, poll it yourself
_POLL_S = 0.2  # the longest wait in one poll (Ctrl-C reaches the caller between polls)
_LINGER_MS = 500  # at close: how long the bye may take to leave


def find_daemon(config: Config) -> Client | None:
    """A client of the daemon when its socket answers within ``daemon.connect_timeout_s``
    (none without waiting when :func:`~actors.daemon.address.may_answer` says no one can)."""
    if not may_answer(config):
        return None
    client = Client.from_config(config)
    try:
        if client.ping(config.daemon.connect_timeout_s):
            return client
    except LoopdError:  # it answers, and refuses: say why rather than run without it
        client.close()
        raise
    client.close()
    return None
