"""No sequence of connections or messages ends the daemon.

A real ``loopd serve`` and real clients: raw DEALERs that claim routing ids, hundreds of
idle connections, one client opening session after session. Each attack ended the daemon
(libzmq's abort) or grew it without bound before the fix.
"""

from __future__ import annotations

import contextlib
import ctypes
import resource
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import zmq

from actors.base.errors import DaemonError, LimitError
from actors.daemon import protocol as p
from actors.daemon.address import endpoint
from actors.daemon.client import Client, find_daemon
from tests.daemon.daemonkit import Daemon, daemon_config
from tests.support.fake_llama import FakeLlama
from tests.support.watch import wait_until


@contextlib.contextmanager
def connections(where: str, count: int, ids: list[bytes] | None = None) -> Iterator[list[Any]]:
    """``count`` DEALERs connected to ``where`` (with the routing ids ``ids`` when given), each
    past its handshake (it got an answer to a ping, or ``count`` of them were accepted)."""
    ctx: zmq.Context[Any] = zmq.Context()
    ctx.set(zmq.MAX_SOCKETS, count + 64)
    socks = []
    try:
        for n in range(count):
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            if ids is not None:
                sock.setsockopt(zmq.ROUTING_ID, ids[n])
            sock.connect(where)
            socks.append(sock)
        yield socks
    finally:
        for sock in socks:
            sock.close(linger=0)
        ctx.term()


def _glibc_rand_ids(draws: int, each: int) -> list[bytes]:
    """The ids a ROUTER would give peers that bring none, if C ``rand()`` is unseeded (as
    libzmq leaves it): ``\\x00`` + its counter, which starts at ``generate_random()``, the
    ``draws`` first values that rand() gives in a fresh process, and the ``each`` next."""
    code = (
        "import ctypes; r = ctypes.CDLL(None).rand; "
        f"print(' '.join(str(r()) for _ in range({draws + 1})))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    r = [int(x) for x in out.stdout.split()]
    starts = [((r[k + 1] << 31) | r[k]) & 0xFFFFFFFF for k in range(draws)]
    counted = [(s + j) & 0xFFFFFFFF for s in starts for j in range(each)]
    return [b"\x00" + n.to_bytes(4, "big") for n in counted]


def _ping_all(socks: list[Any]) -> int:
    """Send a ping from each socket; how many got any answer."""
    for sock in socks:
        sock.send(p.encode(p.Ping()))
    answered = 0
    for sock in socks:
        if sock.poll(5000):
            sock.recv()
            answered += 1
    return answered


# --- (a) routing ids -----------------------------------------------------------------------


def test_peers_claiming_the_ids_libzmq_would_assign_next_cannot_end_the_daemon(
    tmp_path: Path, run_dir: Path, fake: FakeLlama
) -> None:
    assert hasattr(ctypes.CDLL(None), "rand")
    config = daemon_config(tmp_path, run_dir, fake.url, max_clients=1000)  # all are let in
    with Daemon(config) as daemon:
        where = endpoint(daemon.config)
        claims = _glibc_rand_ids(draws=8, each=24)  # 192 connections
        with connections(where, len(claims), claims) as claimed:
            assert _ping_all(claimed) == len(claims)  # they are all in, with those ids
            for _ in range(3):  # ordinary clients: the daemon names them (if they bring none)
                with connections(where, 1) as (plain,):
                    assert _ping_all([plain]) == 1
                with Client.from_config(daemon.config) as client:
                    assert client.status().pid == daemon.pid
        assert daemon.proc.poll() is None, daemon.text()


def test_a_peer_cannot_take_over_a_connected_clients_id(
    tmp_path: Path, run_dir: Path, fake: FakeLlama
) -> None:
    with Daemon(daemon_config(tmp_path, run_dir, fake.url)) as daemon, daemon.client() as owner:
        owner.open("mine")
        own_id = owner.routing_id
        assert len(own_id) == 16 and own_id[0] != 0  # random, never of the reserved form
        with connections(endpoint(daemon.config), 1, [own_id]) as (thief,):
            thief.send(p.encode(p.Close(1, "mine")))
            thief.send(p.encode(p.Ping()))
            assert thief.poll(1000) == 0  # libzmq ignores a peer with a taken id
        assert [row["name"] for row in owner.status().sessions] == ["mine"]
        assert daemon.proc.poll() is None


def test_two_clients_never_share_an_id() -> None:
    ids = {Client("ipc:///nonexistent/loopd.sock").routing_id for _ in range(2)}
    assert len(ids) == 2


# --- (b) descriptors -------------------------------------------------------------------------


def _limited(soft: int, hard: int | None = None) -> Any:
    """A preexec_fn that starts the daemon with this soft (and hard) descriptor limit."""

    def apply() -> None:
        _, real_hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, real_hard if hard is None else hard))

    return apply


def test_hundreds_of_connections_over_the_soft_limit_do_not_end_the_daemon(
    tmp_path: Path, run_dir: Path, fake: FakeLlama
) -> None:
    """A daemon started with a soft limit of 256 (the hard one higher, as on most systems)
    raises it at start: 400 connections are served."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2048:
        pytest.skip(f"the hard descriptor limit here is {hard}")
    config = daemon_config(tmp_path, run_dir, fake.url, max_clients=1000)
    with Daemon(config, preexec_fn=_limited(256)) as daemon:
        with connections(endpoint(daemon.config), 400) as idle:
            assert _ping_all(idle) == 400
            assert daemon.client().ping(10)
        assert daemon.proc.poll() is None, daemon.text()


def test_connections_up_to_the_hard_limit_do_not_end_the_daemon(
    tmp_path: Path, run_dir: Path, fake: FakeLlama
) -> None:
    """With a hard limit of 256 the daemon stops listening before its descriptors run out;
    once the flood is gone it listens again and serves."""
    config = daemon_config(tmp_path, run_dir, fake.url)
    with Daemon(config, preexec_fn=_limited(256, 256)) as daemon:
        with connections(endpoint(daemon.config), 400) as flood:
            for sock in flood:
                sock.send(p.encode(p.Ping()))
            wait_until(lambda: "stops listening" in daemon.text(), timeout=60,
                       what="the daemon to stop listening")  # fmt: skip
            assert daemon.proc.poll() is None, daemon.text()
        def serves() -> bool:
            """Until the flood's clients have timed out the daemon may refuse ("clients
            already") or, on a loaded machine, answer late: both are "not yet"; only the
            daemon's death or the hang guard ends the wait."""
            try:
                return find_daemon(daemon.config) is not None
            except DaemonError:
                return False

        wait_until(lambda: daemon.proc.poll() is not None or serves(),
                   what="the daemon to listen and serve again")  # fmt: skip
        assert daemon.proc.poll() is None, daemon.text()
        with daemon.client() as client:
            assert client.status().pid == daemon.pid


# --- (c) clients and sessions ------------------------------------------------------------------


def test_one_client_cannot_open_sessions_without_end(
    tmp_path: Path, run_dir: Path, fake: FakeLlama
) -> None:
    """The defaults hold: 32 sessions for one client (each is a thread and an open log)."""
    per_client = 32  # daemon.max_sessions_per_client's default (config/loopd.toml)
    with Daemon(daemon_config(tmp_path, run_dir, fake.url)) as daemon, daemon.client() as one:
        for n in range(per_client):
            one.open(f"s{n}")
        threads = psutil.Process(daemon.pid).num_threads()
        for n in range(per_client, per_client + 20):
            with pytest.raises(LimitError, match=r"daemon\.max_sessions_per_client"):
                one.open(f"s{n}")
        assert psutil.Process(daemon.pid).num_threads() <= threads + 2
        with pytest.raises(LimitError, match=f"{per_client} sessions open"):  # a turn opens
            list(one.turn("another", "t1 :: list_dir {}"))  # one too
        one.close_session("s0")
        one.open("s-again")  # room again
        with daemon.client() as other:  # the cap is per client
            other.open("theirs")
        assert daemon.proc.poll() is None


def test_clients_over_the_cap_are_refused_with_the_reason(
    tmp_path: Path, run_dir: Path, fake: FakeLlama
) -> None:
    config = daemon_config(tmp_path, run_dir, fake.url, max_clients=2)
    with Daemon(config) as daemon, daemon.client() as one, daemon.client() as two:
        assert one.ping(10) and two.ping(10)
        with daemon.client() as three:
            with pytest.raises(DaemonError, match=r"daemon\.max_clients"):
                three.ping(10)
            with pytest.raises(DaemonError, match=r"daemon\.max_clients"):
                three.sessions()
        with pytest.raises(DaemonError, match=r"daemon\.max_clients"):
            find_daemon(daemon.config)  # what `loopd run` says, instead of running alone
        one.close()
        wait_until(lambda: _answers(daemon), timeout=30, what="room for a client again")
        assert daemon.proc.poll() is None


def _answers(daemon: Daemon) -> bool:
    try:
        client = find_daemon(daemon.config)
    except DaemonError:
        return False
    if client is None:
        return False
    client.close()
    return True
