"""``loopd serve`` as a real process: clients on real sockets, the CLI in real processes.

The fake llama-server (the agent script, :mod:`tests.support.scripted_llama`) runs in this
process on loopback; the daemon and its tool host are processes of their own.
"""

from __future__ import annotations

import json
import os
import re
import socket
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import psutil
import pytest
import zmq

from actors.base import config as cfg
from actors.base.errors import Cancelled, SessionInUse
from actors.base.processes.trees import is_alive, kill_tree
from actors.daemon import protocol as p
from actors.daemon.address import endpoint
from actors.daemon.client import Client, find_daemon
from actors.log.records import Assistant, ToolResult, User
from actors.wire.curve import load_public, load_secret
from tests.daemon.daemonkit import ROOT, Daemon, cli, daemon_config, env
from tests.support.curve_host import server_keys
from tests.support.fake_llama import FakeLlama
from tests.support.watch import wait_until
from tests.tools.hostkit import raw_dealer, short_dir


@pytest.fixture
def config(tmp_path: Path, run_dir: Path, fake: FakeLlama) -> Path:
    return daemon_config(tmp_path, run_dir, fake.url)


@pytest.fixture
def daemon(config: Path) -> Iterator[Daemon]:
    with Daemon(config) as d:
        yield d


def _run_command(command: str) -> str:
    return f'run_command {json.dumps({"command": command})}'


def test_two_clients_run_turns_on_two_sessions_at_once(daemon: Daemon) -> None:
    """A's tool waits for a file that only B's turn makes: A ends only if B ran meanwhile."""
    ws = Path(daemon.config.tools.workspace)
    wait = "for i in $(seq 1 500); do [ -f b.flag ] && echo saw-b && exit 0; sleep 0.02; done"
    with daemon.client() as a, daemon.client() as b:
        turn_a = a.turn("alpha", f"a1 :: {_run_command(wait)}")
        events_a = iter(turn_a)
        started = next(e for e in events_a if type(e).__name__ == "ToolCallStarted")
        assert started.name == "call_tool"
        outcome_b = b.turn("beta", f"b1 :: {_run_command('touch b.flag')}").run(lambda e: None)
        rest = list(events_a)
    assert turn_a.outcome is not None and turn_a.outcome.content == "done a1."
    assert outcome_b.content == "done b1."
    assert any(type(e).__name__ == "Content" for e in rest)
    assert (ws / "b.flag").exists()
    with daemon.client() as reader:
        alpha = reader.read_log("alpha")
    results = [r for r in alpha if isinstance(r, ToolResult)]
    assert len(results) == 1 and "saw-b" in results[0].content


def test_a_turns_answers_are_read_in_the_thread_that_iterates_it(daemon: Daemon) -> None:
    """No hop through a reader thread: the waiting thread polls the socket itself. (The
    client's own thread takes the socket only every quarter heartbeat: 15 s here.)"""
    d = daemon.config.daemon
    with Client(endpoint(daemon.config), heartbeat_s=60.0,
                max_frame_bytes=d.max_frame_bytes) as client:  # fmt: skip
        readers: list[str] = []
        deliver = client._deliver

        def recorded(frame: bytes) -> None:
            readers.append(threading.current_thread().name)
            deliver(frame)

        client._deliver = recorded  # type: ignore[method-assign]
        outcome = client.turn("r", "t1 :: list_dir {}").run(lambda e: None)
    assert outcome.content == "done t1."
    assert len(readers) >= 2 and set(readers) == {threading.current_thread().name}


def test_threads_sharing_one_client_run_turns_at_once(daemon: Daemon) -> None:
    """A's tool waits for a file that only B's turn makes, both on one client: while A's
    thread holds the socket B's answers reach B, and A's reach A once B lets go."""
    wait = "for i in $(seq 1 500); do [ -f c.flag ] && echo saw-c && exit 0; sleep 0.02; done"
    with daemon.client() as client:
        turn_a = client.turn("alpha", f"a1 :: {_run_command(wait)}")
        events_a = iter(turn_a)
        next(e for e in events_a if type(e).__name__ == "ToolCallStarted")
        rest = threading.Thread(target=lambda: list(events_a))
        rest.start()  # A's thread now waits (and polls) while B runs here
        b = client.turn("beta", f"b1 :: {_run_command('touch c.flag')}").run(lambda e: None)
        rest.join(60)
        assert not rest.is_alive()
    assert b.content == "done b1."
    assert turn_a.outcome is not None and turn_a.outcome.content == "done a1."


def test_a_second_client_is_refused_a_session_in_use(daemon: Daemon) -> None:
    with daemon.client() as first, daemon.client() as second:
        first.open("shared")
        with pytest.raises(SessionInUse, match=r"^session shared is in use by another client$"):
            second.open("shared")
        with pytest.raises(SessionInUse):
            list(second.turn("shared", "t1 :: list_dir {}"))
        refused = cli(daemon.config_path, "run", "t2 :: list_dir {}", "--session", "shared")
        assert refused.returncode == 5
        assert "session shared is in use by another client" in refused.stderr
        first.close_session("shared")
        assert second.open("shared").session == "shared"  # free again once closed
        assert second.turn("shared", "t3 :: list_dir {}").run(lambda e: None).tool_calls == 1


def test_a_session_is_free_again_when_its_client_closes(daemon: Daemon) -> None:
    with daemon.client() as first:
        first.open("s")
    with daemon.client() as second:  # the daemon saw the first client go
        assert second.open("s").created is False


def _raw_send(sock: zmq.Socket[Any], *frames: bytes) -> dict[str, Any] | None:
    sock.send_multipart(list(frames))
    if not sock.poll(10_000):
        return None
    body: dict[str, Any] = msgpack.unpackb(sock.recv())
    return body


def test_garbage_on_the_client_socket_is_answered_and_the_daemon_goes_on(
    daemon: Daemon,
) -> None:
    where = endpoint(daemon.config)
    with raw_dealer(where) as raw:
        cases = [
            (b"\xc1 not msgpack", 0, "not a msgpack message"),
            (msgpack.packb([1, 2, 3]), 0, "must be a msgpack map"),
            (msgpack.packb({"v": 99, "kind": "status", "id": 3}), 3, "version 99"),
            (msgpack.packb({"v": 1, "kind": "explode", "id": 4}), 4, "unknown message kind"),
            (msgpack.packb({"v": 1, "kind": "status", "id": 5, "x": 1}), 5, "unknown field"),
            (msgpack.packb({"v": 1, "kind": "open", "id": 6, "session": 1, "create": True}),
             6, "open.session: expected str"),
            (msgpack.packb({"v": 1, "kind": "turn", "id": 7, "session": "s"}), 7, "missing"),
            (msgpack.packb({"v": 1, "kind": "pong"}), 0, "does not take Pong"),
        ]  # fmt: skip
        for frame, rid, text in cases:
            answer = _raw_send(raw, frame)
            assert answer is not None and answer["kind"] == "error", frame
            assert answer["id"] == rid and text in answer["message"], answer
            assert answer["error"] == "WireError" and answer["exit_code"] == 1
        two = _raw_send(raw, p.encode(p.Status(8)), b"extra")
        assert two is not None and "one frame" in two["message"]
        # an answer to a valid request still comes on the same socket
        status = _raw_send(raw, p.encode(p.Status(9)))
        assert status is not None and status["kind"] == "status_reply" and status["id"] == 9
    with raw_dealer(where) as big:  # over the frame limit: libzmq drops that peer
        big.send(b"\x00" * (daemon.config.daemon.max_frame_bytes + 1))
    path = where.removeprefix("ipc://")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:  # not even ZMTP
        s.connect(path)
        s.sendall(os.urandom(4096))
    with daemon.client() as client:
        assert client.turn("after", "t1 :: list_dir {}").run(lambda e: None).tool_calls == 1
    assert "bad frame from client" in daemon.text()


def test_status_stop_pid_file_and_a_private_runtime_dir(daemon: Daemon) -> None:
    run_dir = Path(daemon.config.daemon.runtime_dir)
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700
    assert (run_dir / "loopd.pid").read_text().strip() == str(daemon.pid)
    with daemon.client() as client:
        client.open("kept")
        shown = cli(daemon.config_path, "status")
    assert shown.returncode == 0, shown.stderr
    assert f"pid {daemon.pid}" in shown.stdout and "session kept: attached" in shown.stdout
    assert f"workspace {daemon.config.workspace}" in shown.stdout
    again = cli(daemon.config_path, "serve")
    assert again.returncode == 2 and "already running" in again.stderr
    hosts = daemon.children()
    assert hosts  # its tool host
    stopped = cli(daemon.config_path, "stop")
    assert stopped.returncode == 0 and f"(pid {daemon.pid}) stopped" in stopped.stderr
    assert daemon.proc.wait(30) == 0
    assert not (run_dir / "loopd.pid").exists() and not (run_dir / "loopd.sock").exists()
    assert not any(h.is_running() and h.status() != "zombie" for h in hosts)
    gone = cli(daemon.config_path, "status")
    assert gone.returncode == 4 and "no loopd daemon answers" in gone.stderr


def test_run_and_chat_go_through_the_daemon_and_show_the_same(daemon: Daemon) -> None:
    message = 't1 :: read_file {"path": "notes.txt"}'
    remote = cli(daemon.config_path, "run", message, "--session", "r")
    local = cli(daemon.config_path, "run", message, "--session", "l", "--local")
    assert remote.returncode == local.returncode == 0, remote.stderr + local.stderr
    assert remote.stdout == local.stdout == "done t1.\n"
    assert "starting tool hosts" in local.stderr  # in-process: it built its own world
    assert "starting tool hosts" not in remote.stderr  # the daemon's world was there
    assert _turn_view(remote.stderr) == _turn_view(local.stderr)  # tool lines, the summary
    assert "→ call_tool" in _turn_view(remote.stderr)
    as_json = [cli(daemon.config_path, "run", message.replace("t1", "t2"), "--session", s,
                   "--json", *extra) for s, extra in (("r", ()), ("l", ("--local",)))]  # fmt: skip
    events = [[json.loads(line)["event"] for line in r.stdout.splitlines()] for r in as_json]
    assert [e for e in events[0] if e != "status"] == [e for e in events[1] if e != "status"]
    assert events[0][-1] == "answer" and "status" not in events[0]
    with daemon.client() as client:
        records = client.read_log("r")
    assert [type(r).__name__ for r in records[1:] if isinstance(r, User | Assistant)] == [
        "User", "Assistant", "Assistant"] * 2  # fmt: skip
    chat = cli(daemon.config_path, "chat", "--session", "c")  # stdin empty: Ctrl-D at once
    assert chat.returncode == 0 and "session c" in chat.stdout


def _imported(config: Path, *args: str) -> set[str]:
    """Every module a ``loopd run`` process imported (``python -X importtime`` lists them)."""
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "actors.cli", "run", "t1", *args,
         "--config", str(config)],
        cwd=ROOT, env=env(), capture_output=True, text=True, timeout=60,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert result.returncode == 0 and result.stdout == "done t1.\n", result.stderr
    return {line.rpartition("|")[2].strip() for line in result.stderr.splitlines()
            if line.startswith("import time:")}


WORLD = {"actors.session.actor", "actors.service.local", "actors.inference.actor",
         "actors.inference.slots.keeper", "actors.tools.toolbox", "actors.session.world"}


def test_loopd_run_through_the_daemon_loads_no_pykka(daemon: Daemon) -> None:
    """What a command the daemon runs pays for: its client and the session service's types,
    none of the world (no pykka, no session actor, no inference actor or slot keeper, no
    tool hosts). The same check on a ``--local`` run sees them, so it can fail."""
    through = _imported(daemon.config_path, "--session", "imports")
    assert {"actors.service.remote", "actors.daemon.client"} <= through
    world = {m for m in through if m.partition(".")[0] == "pykka" or m in WORLD}
    assert world == set()
    here = _imported(daemon.config_path, "--session", "imports-here", "--local")
    assert {"pykka", *WORLD} <= here


def _turn_view(stderr: str) -> str:
    """What a turn showed: from its first tool line on, the summary's seconds left out."""
    return re.sub(r" · [0-9.]+ s · ", " · T s · ", stderr[stderr.index("→") :])


def test_without_a_daemon_run_is_in_process(config: Path) -> None:
    result = cli(config, "run", "t1 :: list_dir {}", "--session", "x")
    assert result.returncode == 0 and result.stdout == "done t1.\n"
    assert "starting tool hosts" in result.stderr
    assert find_daemon(cfg.load(config)) is None


def test_tcp_needs_curve(tmp_path: Path, run_dir: Path, fake: FakeLlama) -> None:
    config = daemon_config(tmp_path, run_dir, fake.url, endpoint="tcp://127.0.0.1:0")
    result = cli(config, "serve")
    assert result.returncode == 2 and "a tcp:// socket needs CURVE keys" in result.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_a_curve_client_with_an_unknown_key_gets_nothing(
    tmp_path: Path, run_dir: Path, fake: FakeLlama
) -> None:
    keys, allowed, server_secret = server_keys(tmp_path, "daemon")
    where = f"tcp://127.0.0.1:{_free_port()}"
    config = daemon_config(
        tmp_path, run_dir, fake.url, endpoint=where, curve_secret=str(server_secret),
        allow_keys=str(allowed), server_key=str(keys / "daemon.key"),
        client_key=str(keys / "friend.key_secret"),
    )  # fmt: skip
    with Daemon(config) as daemon:
        with daemon.client() as client:  # the friend, as the config says
            assert client.turn("far", "t1 :: list_dir {}").run(lambda e: None).tool_calls == 1
        public, secret = load_secret(keys / "stranger.key_secret")
        stranger = Client(where, curve=(load_public(str(keys / "daemon.key")), public, secret))
        with stranger:
            assert stranger.ping(1.0) is False
        with raw_dealer(where, curve_serverkey=load_public(str(keys / "daemon.key")),
                        curve_publickey=public, curve_secretkey=secret) as raw:  # fmt: skip
            raw.send(p.encode(p.Turn(1, "stolen", "t1 :: list_dir {}")))
            assert raw.poll(1000) == 0  # no answer, no error: nothing at all
        with raw_dealer(where) as plain:  # no CURVE at all
            plain.send(p.encode(p.Status(1)))
            assert plain.poll(500) == 0
        assert not (Path(cfg.load(config).log_dir) / "stolen").exists()
        assert "refused a client with unknown key" in daemon.text()


def _tear(path: Path) -> None:
    with path.open("ab") as f:
        f.write(b"\x40\x00\x00\x00\x00\x00\x00\x00partial")  # a write a crash cut short


def _released(daemon: Daemon, session: str) -> None:
    def free() -> bool:
        with daemon.client() as client:
            return session not in [row["name"] for row in client.status().sessions]

    wait_until(free, 20, f"the daemon to close session {session}")


def test_a_torn_tail_cut_by_the_daemon_is_shown_as_in_process(daemon: Daemon) -> None:
    path = daemon.config.log_dir / "torn" / "log.bin"
    assert cli(daemon.config_path, "run", "t1 :: list_dir {}", "--session", "torn").returncode == 0
    shown = []
    for n, extra in ((2, ()), (3, ("--local",))):
        _released(daemon, "torn")
        _tear(path)
        shown.append(cli(daemon.config_path, "run", f"t{n} :: list_dir {{}}", "--session",
                         "torn", *extra))  # fmt: skip
    said = [re.findall(r"session torn: the log ended in a torn record.*?kept", " ".join(
        r.stderr.split())) for r in shown]  # fmt: skip
    assert said[0] == said[1] and len(said[0]) == 1 and "cut 15 bytes" in said[0][0]
    _tear(path)
    with daemon.client() as client:  # a turn that opens its session says it as an event
        events = list(client.turn("torn", "t4 :: list_dir {}"))
    assert type(events[0]).__name__ == "TornTail" and events[0].cut_bytes == 15


def test_serve_detach_returns_once_the_daemon_answers(config: Path) -> None:
    loaded = cfg.load(config)
    started = cli(config, "serve", "--detach")
    match = re.search(r"started \(pid (\d+)\)", started.stderr)
    pid = int(match.group(1)) if match else 0
    try:
        assert started.returncode == 0 and pid, started.stderr
        assert f"on workspace {loaded.workspace}" in " ".join(started.stderr.split())
        client = find_daemon(loaded)  # it answers the moment --detach returns
        assert client is not None
        with client:
            assert client.status().pid == pid
        again = cli(config, "serve", "--detach")
        assert again.returncode == 2 and f"already running (pid {pid})" in again.stderr
        assert cli(config, "stop").returncode == 0
        assert not psutil.pid_exists(pid) or not is_alive(psutil.Process(pid))
        assert "serving the client protocol" in (
            Path(loaded.daemon.runtime_dir) / "loopd.log").read_text()  # fmt: skip
    finally:
        if pid and psutil.pid_exists(pid):
            kill_tree(pid)


def test_a_command_with_a_world_of_its_own_runs_in_process(daemon: Daemon) -> None:
    """--url, --workspace and --log-dir are this command's own: not the daemon's."""
    other = daemon.config_path.parent / "other-sessions"
    result = cli(daemon.config_path, "run", "t1 :: list_dir {}", "--session", "own",
                 "--log-dir", str(other))  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "starting tool hosts" in result.stderr  # it built its own world
    assert (other / "own" / "log.bin").is_file()
    assert not (daemon.config.log_dir / "own").exists()


def test_a_runtime_dir_others_can_reach_is_refused_by_serve_and_passed_over_by_run(
    config: Path, run_dir: Path
) -> None:
    run_dir.mkdir(parents=True)
    run_dir.chmod(0o755)
    (run_dir / "loopd.sock").touch()  # as if someone had put a socket there
    served = cli(config, "serve")
    said = " ".join(served.stderr.split())
    assert served.returncode == 2 and "can be reached by others (mode 755)" in said
    assert find_daemon(cfg.load(config)) is None
    ran = cli(config, "run", "t1 :: list_dir {}", "--session", "x")
    assert ran.returncode == 0 and "starting tool hosts" in ran.stderr  # in-process


def test_cancel_ends_a_turn_and_the_session_lists_and_reads(daemon: Daemon) -> None:
    with daemon.client() as client:
        turn = client.turn("c", f"t1 :: {_run_command('sleep 60; echo too-late')}")
        events = iter(turn)
        next(e for e in events if type(e).__name__ == "ToolCallStarted")
        turn.cancel()
        with pytest.raises(Cancelled):
            list(events)
        assert "c" in client.sessions()
        records = client.read_log("c")
        assert client.turn("c", "t2 :: list_dir {}").run(lambda e: None).content == "done t2."
    assert [type(r).__name__ for r in records] == ["Baseline", "User", "Assistant", "Usage"]


def test_a_pid_file_that_is_a_symlink_is_refused_and_nothing_written_through_it(
    tmp_path: Path,
) -> None:
    """`loopd serve` opened its pid file through a symlink and truncated what it pointed to."""
    with short_dir() as d:
        run_dir = d / "run"
        run_dir.mkdir(mode=0o700)
        victim = tmp_path / "precious.txt"
        victim.write_text("keep me\n")
        (run_dir / "loopd.pid").symlink_to(victim)
        config = daemon_config(tmp_path / "c", run_dir, "http://127.0.0.1:9")
        done = cli(config, "serve", timeout=60)
    assert done.returncode == 2, done.stderr
    assert f"the pid file {run_dir / 'loopd.pid'} cannot be opened" in done.stderr
    assert "it is a symlink" in done.stderr and "Traceback" not in done.stderr
    assert victim.read_text() == "keep me\n"
