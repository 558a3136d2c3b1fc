"""The daemon's loop under a client that floods it: request work is bounded per client and
in all (more than a thousand pipelined requests get answers or an error naming the limit,
a bounded number of threads, and the daemon goes on), and what it holds for a client that
never reads is bounded in bytes (past a tenth its requests are refused, past the whole it
is given up and the bytes freed).

The real loop (actors/daemon/server/loop.py) on a real ROUTER socket, in this process; the
in-process session service it calls forks on a stand-in World whose ``fork`` waits on a
gate, so how many requests are in progress at once is decided by the test, not by timing."""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import zmq

from actors.base.config import Config
from actors.daemon import protocol as p
from actors.daemon.server import loop as loop_module
from actors.daemon.server.loop import SEND_QUEUE, Server
from actors.log.file import SessionLog
from actors.log.records import Baseline, User
from actors.log.sessiondir import session_path
from actors.service import local as local_module
from actors.service.local import LocalService
from actors.service.types import Forked
from tests.support.watch import HANG_S, wait_until

pytestmark = pytest.mark.timeout(240)
FLOOD = 1_500


class Gated:
    """The World's part the loop reaches: ``fork`` waits until the gate opens."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.gate = threading.Event()
        self.waiting = 0
        self.threads: list[int] = []  # the thread of each fork, in order
        self._lock = threading.Lock()

    def fork(self, source: str, name: str, at: int | None) -> Forked:
        with self._lock:
            self.waiting += 1
            self.threads.append(threading.get_ident())
        self.gate.wait(HANG_S)
        return Forked(name, source, 1, 2, 0)

    def describe(self) -> str:
        return "stand-in"


class Rig:
    def __init__(self, tmp: Path, **limits: Any) -> None:
        self.config = Config().replace("log", dir=str(tmp / "sessions"), fsync="never")
        self.world = Gated(self.config)
        self.ctx: zmq.Context[Any] = zmq.Context()
        sock = self.ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        sock.setsockopt(zmq.SNDHWM, SEND_QUEUE)
        sock.setsockopt(zmq.LINGER, 0)
        tmp.mkdir(parents=True)
        self.endpoint = f"inproc://loopd-{id(self)}"
        sock.bind(self.endpoint)
        self.server = Server(self.world, sock, endpoint=self.endpoint, heartbeat_s=60,
                             max_frame_bytes=4 * 1024 * 1024, **limits)
        self.thread = threading.Thread(target=self.server.serve, daemon=True)
        self.thread.start()

    def client(self, rcvhwm: int = 1000) -> zmq.Socket[Any]:
        sock = self.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVHWM, rcvhwm)
        sock.connect(self.endpoint)
        return sock

    def close(self) -> None:
        self.world.gate.set()
        self.server.request_stop()
        self.thread.join(HANG_S)
        self.ctx.destroy(linger=0)


def _stand_in_fork(self: LocalService, source: str, name: str, at: int | None = None) -> Any:
    return self.table.worlds.get().fork(source, name, at)  # Gated's: it waits on the gate


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Any]:
    rigs: list[Rig] = []

    def start(**limits: Any) -> Rig:
        rigs.append(Rig(tmp_path / str(len(rigs)), **limits))
        return rigs[-1]

    with pytest.MonkeyPatch.context() as patch:  # its own: a test's undo() leaves it
        patch.setattr(LocalService, "fork", _stand_in_fork)
        yield start
    for rig in rigs:
        rig.close()


def answers(sock: zmq.Socket[Any], n: int) -> list[p.Message]:
    out = []
    while len(out) < n:
        assert sock.poll(HANG_S * 1000), f"{len(out)} answers of {n}"
        out.append(p.decode(sock.recv(), 1 << 30))
    return out


def alive(sock: zmq.Socket[Any]) -> bool:
    sock.send(p.encode(p.Status(id=999_999)))
    (reply,) = answers(sock, 1)
    return isinstance(reply, p.StatusReply)


def test_a_flood_of_pipelined_requests_gets_answers_or_the_limit_and_few_threads(
    make: Any,
) -> None:
    rig = make(max_requests_per_client=8, max_requests=12)
    threads = threading.active_count()
    a, b = rig.client(), rig.client()
    for rid in range(1, FLOOD + 1):
        a.send(p.encode(p.Fork(id=rid, source="src", session=f"n{rid}", at=None)))
    refused = answers(a, FLOOD - 8)  # all but the 8 in progress, at once
    assert all(isinstance(m, p.Error) and "daemon.max_requests_per_client = 8" in m.message
               for m in refused), refused[:3]
    wait_until(lambda: rig.world.waiting == 8, timeout=HANG_S, what="8 forks in progress")
    for rid in range(1, 11):  # another client: 4 more fit in all, then the total's limit
        b.send(p.encode(p.Fork(id=rid, source="src", session=f"m{rid}", at=None)))
    over = answers(b, 6)
    assert all(isinstance(m, p.Error) and "daemon.max_requests = 12" in m.message for m in over)
    assert threading.active_count() <= threads + 12 + 1
    assert alive(a) and alive(b)
    rig.world.gate.set()
    done = answers(a, 8) + answers(b, 4)
    assert all(isinstance(m, p.ForkReply) for m in done), done
    assert alive(a)  # and the counts came back: new work is taken again
    a.send(p.encode(p.Fork(id=FLOOD + 1, source="src", session="again", at=None)))
    assert isinstance(answers(a, 1)[0], p.ForkReply)


def write_log(config: Config, name: str, records: int) -> None:
    base = Baseline(system="s", tools=(), model="m", created=dt.datetime.now(dt.UTC))
    log, _ = SessionLog.open(session_path(config, name), fsync="never", baseline=base)
    with log:
        for _ in range(records):
            log.append(User(content="x" * RECORD))


RECORD = 500 * 1024  # one read_log page each (PAGE_BYTES)
HELD = 8 * 1024 * 1024  # daemon.max_client_bytes of these tests
IN_ZMQ = SEND_QUEUE + 1  # what an inproc pipe takes: the daemon's SNDHWM and the reader's 1


@pytest.fixture
def gated_reads(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """read_log's reads wait on the returned gate: the test decides how many are in
    progress when the answers come."""
    gate = threading.Event()
    read = local_module.read_records

    def gated(path: Path, *, name: str = "") -> Any:
        gate.wait(HANG_S)
        return read(path, name=name)

    monkeypatch.setattr(local_module, "read_records", gated)
    return gate


def flood(rig: Rig, gate: threading.Event, n: int) -> tuple[zmq.Socket[Any], Any]:
    """A client that reads nothing sends ``n`` read_log requests, all in progress at once;
    then they are answered. The client and the loop's state of it."""
    deaf = rig.client(rcvhwm=1)
    deaf.send(p.encode(p.Status(id=1)))
    wait_until(lambda: len(rig.server._clients) == 1, timeout=HANG_S, what="the client")
    (state,) = rig.server._clients.values()
    for rid in range(2, n + 2):
        deaf.send(p.encode(p.ReadLog(id=rid, session="big", start=0)))
    wait_until(lambda: state.jobs == n, timeout=HANG_S, what=f"{n} reads in progress")
    gate.set()
    wait_until(lambda: state.jobs == 0, timeout=HANG_S, what="the reads to end")
    return deaf, state


def queued(state: Any, n: int) -> None:
    """Wait until the loop has sent (or queued) what the reads posted: ``n`` queued."""
    wait_until(lambda: len(state.queued) == n, timeout=HANG_S, what=f"{n} answers queued")


def test_a_client_that_does_not_read_is_refused_new_work(make: Any, gated_reads: Any) -> None:
    rig = make(max_client_bytes=HELD, max_requests_per_client=200, max_requests=200)
    write_log(rig.config, "big", 16)
    deaf, state = flood(rig, gated_reads, IN_ZMQ + 3)  # with status's answer, 4 pages wait
    queued(state, 4)
    assert HELD // 10 < state.queued_bytes <= 4 * (RECORD + 1024)
    deaf.send(p.encode(p.ReadLog(id=9_999, session="big", start=0)))
    queued(state, 5)
    refused = p.decode(state.queued[-1], 1 << 30)
    assert isinstance(refused, p.Error) and refused.id == 9_999
    assert "has not read" in refused.message and "daemon.max_client_bytes" in refused.message
    assert rig.server._clients  # refused, not given up


def test_a_client_past_the_bound_is_given_up_and_its_bytes_freed(
    make: Any, gated_reads: Any
) -> None:
    """The review's flood was 1,600 unread pages held (2.1 GiB); here past 8 MiB queued the
    client is given up, whatever its heartbeats say."""
    rig = make(max_client_bytes=HELD, max_requests_per_client=200, max_requests=200)
    write_log(rig.config, "big", 16)
    _, state = flood(rig, gated_reads, IN_ZMQ + HELD // RECORD + 2)
    wait_until(lambda: not rig.server._clients, timeout=HANG_S, what="the client given up")
    assert state.queued_bytes == 0 and not state.queued  # and what it held, freed
    assert alive(rig.client())  # the daemon goes on for everyone else


class NoThreads(threading.Thread):
    """What a process at its thread limit gets: "can't start new thread"."""

    def start(self) -> None:
        raise RuntimeError("can't start new thread")


def test_a_request_runs_in_the_thread_an_earlier_one_left_and_those_end_with_the_loop(
    make: Any,
) -> None:
    """Starting a thread costs every turn ~0.45 ms of wall here: a finished request's thread
    waits for the next; the ones waiting end when the loop does."""
    threads = threading.active_count()
    rig = make()
    rig.world.gate.set()
    client = rig.client()
    for rid in (1, 2, 3):
        client.send(p.encode(p.Fork(id=rid, source="src", session=f"n{rid}", at=None)))
        assert isinstance(answers(client, 1)[0], p.ForkReply)
        wait_until(lambda: rig.server._idle == 1, timeout=HANG_S, what="the thread to wait")
    assert len(rig.world.threads) == 3 and len(set(rig.world.threads)) == 1
    rig.close()
    wait_until(lambda: threading.active_count() <= threads, timeout=HANG_S,
               what="the waiting thread to end")


def test_a_thread_the_system_refuses_is_an_error_answer_and_the_daemon_goes_on(
    make: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    rig = make()
    rig.world.gate.set()
    client = rig.client()
    assert alive(client)
    monkeypatch.setattr(loop_module, "threading", SimpleNamespace(
        Thread=NoThreads, Lock=threading.Lock, active_count=threading.active_count))
    for rid in range(1, 101):
        client.send(p.encode(p.Fork(id=rid, source="src", session=f"n{rid}", at=None)))
    refused = answers(client, 100)
    assert all(isinstance(m, p.Error) and "cannot start a thread" in m.message
               for m in refused), refused[:3]
    monkeypatch.undo()
    assert alive(client)
    client.send(p.encode(p.Fork(id=101, source="src", session="again", at=None)))
    assert isinstance(answers(client, 1)[0], p.ForkReply)  # nothing was left counted
