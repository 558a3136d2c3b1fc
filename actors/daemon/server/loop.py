"""The daemon's request loop: one ROUTER socket, the clients' state, heartbeats, shutdown.

Every request runs through the in-process session service
(:class:`actors.service.local.LocalService`), one per client on the one table of sessions:
the same methods and results a command in this process uses, each result carried by its
answer message (:func:`actors.daemon.protocol.reply`).

The loop's thread owns the socket (ZeroMQ sockets are not thread-safe) and never waits on
a session: it answers ``ping`` and ``status`` at once and hands every other request to a
thread of its own (opening a session reads its log; a turn waits on its session actor).
Those threads post their answers, and a turn's events as they happen, to the loop
(:class:`actors.wire.loop.Loop`), which sends them in order. A turn's messages (its events,
approvals and its end) go through its own :class:`_Outbox`: what the turn made while the
loop was busy leaves together, to a client that asked for it (``turn.batch``) as one
multipart message (one event crossed the socket and two threads on each side, ~120 us of
CPU an event in all; most of a turn's events are made faster than that).

Request work is bounded: a client has at most ``daemon.max_requests_per_client`` requests
in progress (turns included) and all clients together ``daemon.max_requests``, each in a
thread; one more is answered with an error that names the key, and a thread the system
will not start is such an error too, so no sequence of requests ends the daemon.

What the daemon holds for one client is bounded in bytes: ZeroMQ queues at most
:data:`SEND_QUEUE` messages for it (log pages are at most :data:`PAGE_BYTES`), and what
does not fit waits in the client's own queue here, counted. Past a tenth of
``daemon.max_client_bytes`` the client's new requests are refused; past the whole it is
given up (like a client gone silent) and its queue freed.

A client is known by its ZeroMQ routing id. One silent for three ``daemon.heartbeat_s``
(or whose socket stops taking messages) is gone: its turns are cancelled like Ctrl-C and
its sessions detached once their turns end. A frame that is not a valid message is
answered ``error`` (logged at a bounded rate) and the loop goes on.

:meth:`Server.request_stop` (``stop`` from a client, or SIGTERM) ends the loop the clean
way: every turn in flight is cancelled and its ``error`` sent, then the sessions close;
the caller then stops the World (the slot keeper saves the KV states, the hosts stop).
The whole stop is bounded by ``daemon.stop_grace_s`` (:mod:`actors.base.processes.stop_deadline`).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import zmq

from actors.base import telemetry
from actors.base.cancel import CancelToken
from actors.base.errors import DaemonError, LoopdError, WireError
from actors.base.events import Event
from actors.daemon import protocol as p
from actors.log.records import Record
from actors.log.records import encode as encode_record
from actors.service.local import LocalService, SessionTable, Worlds
from actors.session.world import World
from actors.wire.complaints import Complaints
from actors.wire.loop import Heartbeat, Loop
from actors.wire.peer_guard import short

from .approvals import RemoteApprover
from .listening import Listening

__all__ = ["PAGE_BYTES", "SEND_QUEUE", "Server"]

log = logging.getLogger("loopd.daemon")

_WIND_DOWN_S = 30.0  # at stop: how long turns in flight get to end after their cancel
SEND_QUEUE = 64  # messages ZeroMQ queues for one client; more wait in its counted queue
PAGE_BYTES = 512 * 1024  # a read_log page, at most (a record larger goes alone)
_FLUSH_S = 0.02  # how often answers waiting for a slow client are offered to ZeroMQ again
BATCH_PARTS = 64  # a turn's messages sent as one multipart message, at most
IDLE_THREADS = 8  # threads kept waiting for the next request (a request starts one if none)


class _Outbox:
    """One turn's messages on their way to the loop, in the order the turn made them: the
    first one waiting posts the loop's send, which takes every one made until it runs."""

    __slots__ = ("_frames", "_lock", "_post")

    def __init__(self, post: Callable[[_Outbox], None]) -> None:
        self._frames: list[bytes] = []
        self._lock = threading.Lock()
        self._post = post

    def put(self, msg: p.Message) -> None:
        frame = p.encode(msg)  # in the turn's thread: the loop's only sends
        with self._lock:
            self._frames.append(frame)
            first = len(self._frames) == 1
        if first:
            self._post(self)

    def take(self) -> list[bytes]:
        with self._lock:
            frames, self._frames = self._frames, []
        return frames


@dataclasses.dataclass(slots=True)
class _Client:
    heartbeat: Heartbeat
    turns: dict[int, CancelToken] = dataclasses.field(default_factory=dict)
    approvers: dict[int, RemoteApprover] = dataclasses.field(default_factory=dict)
    jobs: int = 0  # requests in progress (turns too)
    queued: collections.deque[bytes] = dataclasses.field(default_factory=collections.deque)
    queued_bytes: int = 0  # what ``queued`` holds: answers ZeroMQ had no room for yet


class Server:
    """Serves the client protocol on ``sock`` (bound by the caller) for the World's sessions."""

    def __init__(
        self, world: World, sock: zmq.Socket[Any], *, endpoint: str, heartbeat_s: float,
        max_frame_bytes: int, max_clients: int = 64, max_sessions_per_client: int = 32,
        max_requests_per_client: int = 48, max_requests: int = 256,
        max_client_bytes: int = 64 * 1024 * 1024,
        fd_limit: int | None = None, on_stopping: Callable[[], None] = lambda: None,
    ) -> None:  # fmt: skip
        self.world = world
        self.sock = sock
        self.endpoint = endpoint
        self.heartbeat_s = heartbeat_s
        self.max_frame = max_frame_bytes
        self.max_clients = max_clients
        self.max_requests_per_client, self.max_requests = max_requests_per_client, max_requests
        self.max_client_bytes = max_client_bytes
        self._jobs = 0  # requests in progress, all clients
        self._flushing: Any = None  # the timer that offers queued answers again
        self.sessions = SessionTable(Worlds(world.config, world), max_sessions_per_client)
        self.on_stopping = on_stopping  # called as the stop begins (the stop's deadline)
        self.started = time.monotonic()
        self._clients: dict[bytes, _Client] = {}
        self._lock = threading.Lock()  # _clients' turns, touched by turn threads at their end
        self._loop = Loop()
        self._loop.add(sock, self._on_frames)
        self.loop = self._loop  # for the signal wake-up (main.py), in the loop's thread
        self._listening = None if fd_limit is None else Listening(
            self._loop, sock, endpoint, fd_limit
        )
        self._running = 0  # requests running in threads (under _lock)
        self._idle = 0  # threads waiting for a request (under _lock)
        self._served = False  # serve() has ended: a request's thread ends with its request
        self._work: queue.SimpleQueue[tuple[str, Callable[[], None]] | None] = queue.SimpleQueue()
        self._complain = Complaints(logger=log)

    # --- from any thread ---------------------------------------------------------------

    def request_stop(self) -> None:
        """End :meth:`serve` the clean way (safe from a signal handler)."""
        self._loop.stop()

    def _post(self, peer: bytes, msg: p.Message) -> None:
        self._loop.post(self._send, peer, p.encode(msg))

    def _spawn(self, name: str, fn: Callable[[], None]) -> bool:
        """Run ``fn`` in a thread: one an earlier request left idle, else a new one; False
        when the system would not start one. (``start`` waits until the new thread runs:
        0.07-0.12 ms of each request's round trip here, docs/bench.md.)"""
        with self._lock:
            self._running += 1
            if self._idle:
                self._idle -= 1
                self._work.put((name, fn))
                return True
        thread = threading.Thread(target=self._worker, args=(name, fn), name=name, daemon=True)
        try:
            thread.start()
        except RuntimeError:  # "can't start new thread": a process or memory limit
            with self._lock:
                self._running -= 1
            return False
        return True

    def _worker(self, name: str, fn: Callable[[], None]) -> None:
        """Run ``fn``, then wait for the next request's, while fewer than
        :data:`IDLE_THREADS` wait already and the daemon is not stopping."""
        me = threading.current_thread()
        while True:
            try:
                fn()
            except Exception:  # each request answers its own errors: this is a bug
                log.exception("a request's thread (%s) failed", name)
            finally:
                with self._lock:
                    self._running -= 1
                    keep = self._idle < IDLE_THREADS and not self._served
                    self._idle += keep
            if not keep:
                return
            job = self._work.get()
            if job is None:  # the daemon has stopped
                return
            name, fn = job
            me.name = name

    def _admit(self, peer: bytes, client: _Client, rid: int) -> bool:
        """Count a request in, or answer it with the limit it is past (False)."""
        refused: str | None = None
        with self._lock:
            if client.queued_bytes > self.max_client_bytes // 10:
                refused = (f"the daemon holds {client.queued_bytes:,} bytes of answers this "
                           "client has not read (daemon.max_client_bytes = "
                           f"{self.max_client_bytes:,}: past a tenth, new requests wait); "
                           "read them first")
            elif client.jobs >= self.max_requests_per_client:
                refused = (f"this client has {client.jobs} requests in progress, the most one "
                           f"client may (daemon.max_requests_per_client = "
                           f"{self.max_requests_per_client}); wait for their answers")
            elif self._jobs >= self.max_requests:
                refused = (f"the daemon has {self._jobs} requests in progress, the most it "
                           f"takes (daemon.max_requests = {self.max_requests}); try again "
                           "when some have been answered")
            else:
                client.jobs += 1
                self._jobs += 1
                return True
        self._complain("request of client %s refused: %s", short(peer), refused)
        self._send(peer, p.encode(_error(rid, DaemonError(refused))))
        return False

    def _done(self, client: _Client) -> None:
        with self._lock:
            client.jobs -= 1
            self._jobs -= 1

    def _run_request(self, peer: bytes, client: _Client, rid: int, name: str,
                     fn: Callable[[], None]) -> bool:
        """``fn`` in a thread of its own, counted (admitted already); its end counts out."""
        def counted() -> None:
            try:
                fn()
            finally:
                self._done(client)

        if not self._spawn(name, counted):
            self._done(client)
            self._complain("no thread for a request of client %s", short(peer))
            self._send(peer, p.encode(_error(rid, DaemonError(
                f"the daemon cannot start a thread for this request now (a process limit: "
                f"{threading.active_count()} threads run); try again, or lower "
                "daemon.max_requests"))))
            return False
        return True

    # --- the loop ----------------------------------------------------------------------

    def serve(self) -> None:
        """Answer until :meth:`request_stop`; then wind every turn down and close sessions."""
        log.info("serving the client protocol on %s", self.endpoint)
        try:
            self._loop.run()
            self.on_stopping()
            self._wind_down()
        finally:
            with self._lock:
                idle, self._idle, self._served = self._idle, 0, True
            for _ in range(idle):  # the threads kept for requests end
                self._work.put(None)
            try:
                self.sessions.close_all()
            finally:  # its monitor socket open, the caller's context would never end
                if self._listening is not None:
                    self._listening.close()
                self._loop.close()

    def _wind_down(self) -> None:
        with self._lock:
            tokens = [t for c in self._clients.values() for t in c.turns.values()]
        if tokens:
            log.info("stopping: cancelling %d turn(s) in flight", len(tokens))
        for token in tokens:
            token.cancel()
        deadline = time.monotonic() + _WIND_DOWN_S
        while time.monotonic() < deadline:
            with self._lock:
                running = self._running
            if not running:
                break
            self._loop.run_once(0.02)
        self._loop.run_once(0)  # what the last threads posted

    def _on_frames(self, frames: list[bytes]) -> None:
        peer = frames[0]
        if len(frames) != 2:
            self._complain("client %s sent %d frames", short(peer), len(frames) - 1)
            self._refuse(peer, WireError("one message must be one frame"))
            return
        try:
            msg = p.decode(frames[1], self.max_frame)
        except WireError as e:
            self._complain("bad frame from client %s: %s", short(peer), e)
            self._refuse(peer, e)
            return
        client = self._clients.get(peer)
        if client is None:
            if len(self._clients) >= self.max_clients:
                self._full(peer, msg)
                return
            silent = functools.partial(self._silent, peer)
            client = self._clients[peer] = _Client(Heartbeat(self._loop, self.heartbeat_s, silent))
        client.heartbeat.heard()
        self._handle(peer, client, msg)

    def _full(self, peer: bytes, msg: p.Message) -> None:
        """A new client while ``max_clients`` are served: every message of its is refused."""
        if isinstance(msg, p.Bye):
            return
        self._complain("client %s refused: %d clients already", short(peer), len(self._clients))
        full = DaemonError(
            f"the loopd daemon serves {self.max_clients} clients already, the most it serves "
            "at once (daemon.max_clients); try again when one has ended"
        )
        self._send(peer, p.encode(_error(getattr(msg, "id", 0), full)))

    def _silent(self, peer: bytes, silence: float) -> None:
        self._gone(peer, f"was silent for {silence:.1f} s")

    def _refuse(self, peer: bytes, e: WireError) -> None:
        self._send(peer, p.encode(_error(e.id or 0, e)))

    def _handle(self, peer: bytes, client: _Client, msg: p.Message) -> None:
        match msg:
            case p.Ping():
                self._send(peer, _PONG)
            case p.Bye():
                self._gone(peer, "left")
            case p.Status(id=rid):
                self._send(peer, p.encode(self._status(rid)))
            case p.Cancel(id=rid):
                with self._lock:
                    token = client.turns.get(rid)
                if token is not None:
                    token.cancel()
            case p.Approve(id=rid):
                with self._lock:
                    approver = client.approvers.get(rid)
                if approver is not None:  # else the turn has ended: nothing waits for it
                    approver.answer(msg)
            case (p.Turn() | p.Open() | p.Fork() | p.Rewind() | p.Compact() | p.Remove()
                  ) if self._loop.stopping:
                stopping = DaemonError("the loopd daemon is stopping; start it again to go on")
                self._send(peer, p.encode(_error(msg.id, stopping)))
            case p.Turn():
                if self._admit(peer, client, msg.id):
                    self._start_turn(peer, client, msg)
            case (p.Open() | p.Close() | p.Sessions() | p.ReadLog() | p.Fork() | p.Rewind()
                  | p.Compact() | p.Remove() | p.SessionStatus()):
                if self._admit(peer, client, msg.id):
                    self._run_request(peer, client, msg.id, f"daemon-{type(msg).__name__.lower()}",
                                      lambda: self._job(peer, msg))
            case p.Stop(id=rid):
                log.info("stop asked by client %s", short(peer))
                self._send(peer, p.encode(p.Ok(rid)))
                self.request_stop()
            case _:
                rid = getattr(msg, "id", 0)
                what = type(msg).__name__
                refused = WireError(f"the daemon does not take {what} messages")
                self._send(peer, p.encode(_error(rid, refused)))

    def _send(self, peer: bytes, frame: bytes) -> None:
        client = self._clients.get(peer)
        if client is not None and client.queued:  # in order: after what waits already
            self._queue(peer, client, frame)
            return
        try:
            self.sock.send_multipart([peer, frame], zmq.NOBLOCK)
        except zmq.Again:  # ZeroMQ's queue for it is full (SEND_QUEUE): it reads slowly
            if client is not None:
                self._queue(peer, client, frame)
        except zmq.ZMQError:  # EHOSTUNREACH (ROUTER_MANDATORY): disconnected
            self._gone(peer, "disconnected")

    def _queue(self, peer: bytes, client: _Client, frame: bytes) -> None:
        """Keep ``frame`` for a client ZeroMQ has no room for; past daemon.max_client_bytes
        the client is given up and what it was sent is freed."""
        with self._lock:
            client.queued.append(frame)
            client.queued_bytes += len(frame)
            over = client.queued_bytes > self.max_client_bytes
        if over:
            self._gone(peer, f"has not read {client.queued_bytes:,} bytes of answers "
                             f"(daemon.max_client_bytes = {self.max_client_bytes:,})")
        elif self._flushing is None:
            self._flushing = self._loop.every(_FLUSH_S, self._flush)

    def _flush(self) -> None:
        """Offer the queued answers to ZeroMQ again, in order, as far as it takes them."""
        waiting = False
        for peer, client in list(self._clients.items()):
            while client.queued:
                try:
                    self.sock.send_multipart([peer, client.queued[0]], zmq.NOBLOCK)
                except zmq.Again:
                    waiting = True
                    break
                except zmq.ZMQError:
                    self._gone(peer, "disconnected")
                    break
                with self._lock:
                    client.queued_bytes -= len(client.queued.popleft())
        if not waiting:
            self._loop.cancel(self._flushing)
            self._flushing = None

    def _gone(self, peer: bytes, why: str) -> None:
        client = self._clients.get(peer)
        if client is None:
            return
        client.heartbeat.cancel()
        with self._lock:
            client.queued.clear()  # given up: what it did not read is freed
            client.queued_bytes = 0
            tokens = list(client.turns.values())
        del self._clients[peer]
        if tokens:
            log.info("client %s %s: cancelling its %d turn(s)", short(peer), why, len(tokens))
        for token in tokens:
            token.cancel()
        self._release(peer)

    def _release(self, peer: bytes) -> None:
        """Close a gone client's sessions in a thread; later when none can start now."""
        if not self._spawn("daemon-release", lambda: self.sessions.release_client(peer)):
            self._loop.call_later(1.0, self._release, peer)

    def _status(self, rid: int) -> p.StatusReply:
        return p.StatusReply(
            id=rid, pid=os.getpid(), endpoint=self.endpoint,
            uptime_s=time.monotonic() - self.started, clients=len(self._clients),
            sessions=tuple(self.sessions.rows()), workspace=str(self.world.config.workspace),
            model=self.world.describe(),
        )  # fmt: skip

    # --- requests, each in a thread of its own -----------------------------------------

    def _job(self, peer: bytes, msg: p.Message) -> None:
        try:
            for answer in self._answers(peer, msg):
                self._post(peer, answer)
        except LoopdError as e:
            self._post(peer, _error(msg.id, e))
        except Exception as e:  # a bug must still answer the request, and not end the daemon
            log.exception("request %s failed", type(msg).__name__)
            self._post(peer, _error(msg.id, e))

    def _service(self, peer: bytes) -> LocalService:
        """The in-process session service, for client ``peer``."""
        return LocalService(self.sessions, peer)

    def _answers(self, peer: bytes, msg: p.Message) -> list[p.Message]:
        service = self._service(peer)
        match msg:
            case p.Open(id=rid, session=name, create=create, servers=servers):
                return [p.reply(rid, service.open(name, create, servers))]
            case p.Close(id=rid, session=name):
                service.close(name)
                return [p.Ok(rid)]
            case p.Sessions(id=rid):
                return [p.SessionList(rid, service.list())]
            case p.ReadLog(id=rid, session=name, start=start):
                return self._log_pages(rid, service.records(name), start)
            case p.Fork(id=rid, source=source, session=name, at=at):
                return [p.reply(rid, service.fork(source, name, at))]
            case p.Rewind(id=rid, session=name, turns=turns):
                return [p.reply(rid, service.rewind(name, turns))]
            case p.Compact(id=rid, session=name):
                return [p.reply(rid, service.compact(name, lambda _: None))]
            case p.Remove(id=rid, session=name):
                service.remove(name)
                return [p.Ok(rid)]
            case p.SessionStatus(id=rid, session=name):
                return [p.reply(rid, service.status(name))]
        raise AssertionError(f"no job for {type(msg).__name__}")

    def _log_pages(self, rid: int, records: tuple[Record, ...], start: int) -> list[p.Message]:
        budget = min(self.max_frame // 2, PAGE_BYTES)
        page: list[bytes] = []
        size, n = 0, start
        while n < len(records):
            blob = encode_record(records[n])
            if page and size + len(blob) > budget:
                break
            page.append(blob)
            size += len(blob) + 8
            n += 1
        return [p.Log(rid, tuple(page), n, n >= len(records))]

    def _start_turn(self, peer: bytes, client: _Client, msg: p.Turn) -> None:
        token = CancelToken()
        outbox = _Outbox(lambda box: self._loop.post(self._send_turn, peer, box, msg.batch))
        with self._lock:
            if msg.id in client.turns:
                client.jobs -= 1
                self._jobs -= 1
                self._post(peer, _error(msg.id, WireError(f"turn id {msg.id} is already running")))
                return
            client.turns[msg.id] = token
            approver = client.approvers[msg.id] = RemoteApprover(msg.id, outbox.put)
        started = self._run_request(
            peer, client, msg.id, f"daemon-turn-{msg.session}",
            lambda: self._turn(peer, client, msg, token, approver, outbox))
        if not started:
            self._end_turn(client, msg.id)

    def _turn(
        self, peer: bytes, client: _Client, msg: p.Turn, token: CancelToken,
        approver: RemoteApprover, outbox: _Outbox,
    ) -> None:  # fmt: skip
        name, rid = msg.session, msg.id
        sink: Callable[[Event], None] = lambda event: outbox.put(  # noqa: E731
            p.encode_event(rid, event)
        )
        try:
            with telemetry.joined(msg.traceparent):  # the turn's spans join the client's
                outcome = self._service(peer).turn(name, msg.text, sink, approver, token,
                                                   msg.approve)
            answer: p.Message = p.Done(
                rid, outcome.content, outcome.iterations, outcome.tool_calls, outcome.cut,
                encode_record(outcome.usage), outcome.restored, outcome.context,
                outcome.compactions,
            )  # fmt: skip
        except LoopdError as e:
            answer = _error(rid, e)
        except Exception as e:  # a bug: the client must still hear that the turn ended
            log.exception("turn on session %s failed", name)
            answer = _error(rid, e)
        finally:
            self._end_turn(client, rid)
        outbox.put(answer)  # after the turn's last event, as it was made

    def _send_turn(self, peer: bytes, outbox: _Outbox, batch: bool) -> None:
        """Send what ``outbox`` holds now, in order: in multipart messages of at most
        :data:`BATCH_PARTS` parts and :data:`PAGE_BYTES` (a larger part goes alone) to a
        client that asked for them, else one message each."""
        frames = outbox.take()
        if not batch:
            for frame in frames:
                self._send(peer, frame)
            return
        start = 0
        while start < len(frames):
            end, size = start, 0
            while end < len(frames) and end - start < BATCH_PARTS and (
                    end == start or size + len(frames[end]) <= PAGE_BYTES):
                size += len(frames[end])
                end += 1
            self._send_parts(peer, frames[start:end])
            start = end

    def _send_parts(self, peer: bytes, frames: list[bytes]) -> None:
        """``frames`` as one multipart message; one by one after what waits already."""
        client = self._clients.get(peer)
        if len(frames) == 1 or (client is not None and client.queued):
            for frame in frames:
                self._send(peer, frame)
            return
        try:
            self.sock.send_multipart([peer, *frames], zmq.NOBLOCK)
        except zmq.Again:  # ZeroMQ's queue for it is full: each waits in its own queue
            for frame in frames:
                if client is None or self._clients.get(peer) is not client:  # given up
                    break
                self._queue(peer, client, frame)
        except zmq.ZMQError:  # EHOSTUNREACH (ROUTER_MANDATORY): disconnected
            self._gone(peer, "disconnected")

    def _end_turn(self, client: _Client, rid: int) -> None:
        with self._lock:
            client.turns.pop(rid, None)
            client.approvers.pop(rid, None)


_PONG = p.encode(p.Pong())


def _error(rid: int, e: BaseException) -> p.Error:
    if isinstance(e, LoopdError):
        return p.Error(rid, type(e).__name__, str(e), e.exit_code)
    return p.Error(rid, "LoopdError", f"the daemon failed: {type(e).__name__}: {e}", 1)
