"""A tool host whose workers do not come back reports itself unhealthy, and is restarted.

Before the fix a host with every worker stuck (a tool that ignores cancel, a read that never
returns) answered "busy" to every call for ever, still answered pings, and so was never
restarted. Now a worker still running ``STUCK_S`` after its call was told to stop makes the
host answer pings with ``Unhealthy``, and the supervisor kills and restarts it.
"""

from __future__ import annotations

import os
import sys

import zmq

from actors.tools.host.server import STUCK_S
from actors.tools.port import HostLauncher, PortSettings, start_port
from actors.tools.protocol import wire
from tests.support.watch import wait_until
from tests.tools.hostkit import FAKE, ask, host_env, raw_dealer, short_dir, spawn_host


def test_a_host_with_a_stuck_worker_is_restarted_by_its_supervisor() -> None:
    with short_dir() as d:
        endpoint = f"ipc://{d}/h.sock"
        argv = (
            sys.executable, "-m", "actors.tools.host", "--bind", endpoint,
            "--provider", FAKE, "--timeout", "0.3", "--max-calls", "1",
            "--parent-pid", str(os.getpid()),
        )  # fmt: skip
        launcher = HostLauncher(argv, env=host_env(), log_path=d / "host.log")
        port = start_port(
            PortSettings("stuck", endpoint, 0.3, 0.2), launcher=launcher, context=zmq.Context()
        )
        try:
            assert port.wait_ready(30)
            first = port.status().pid
            answer = port.call(session="s", call=1, tool="hang", arguments={"seconds": 3600})
            assert isinstance(answer, wire.Failed)
            assert "did not finish within 0.3 s" in answer.message
            wait_until(
                lambda: port.status().restarts >= 1 and port.wait_ready(0.01),
                timeout=STUCK_S + 30,
                what="the stuck host to be restarted",
            )
            assert port.status().pid not in (None, first)
            back = port.call(session="s", call=2, tool="echo", arguments={"text": "back"})
            assert back == wire.Result(back.id, "back")
            log = (d / "host.log").read_text()
            assert "is unhealthy: 1 call did not come back (hang" in log
        finally:
            port.stop()


def test_a_stuck_host_answers_pings_and_calls_with_why() -> None:
    """What the supervisor reads, on the wire: Unhealthy in place of Pong, naming the stuck
    call; a new call is refused with the same reason instead of "busy"."""
    with short_dir() as d:
        endpoint = f"ipc://{d}/h.sock"
        args = ["--provider", FAKE, "--timeout", "0.2", "--max-calls", "4"]
        with spawn_host(endpoint, *args), raw_dealer(endpoint) as sock:
            assert ask(sock, wire.Ping()) == wire.Pong()
            answer = ask(sock, wire.ToolRequest(1, "s", 1, "hang", {"seconds": 3600}))
            assert isinstance(answer, wire.Failed)
            assert ask(sock, wire.Ping()) == wire.Pong()  # told to stop, not yet stuck

            def unhealthy() -> bool:
                return isinstance(ask(sock, wire.Ping()), wire.Unhealthy)

            wait_until(unhealthy, timeout=STUCK_S + 20, what="the host to report the stuck call")
            pong = ask(sock, wire.Ping())
            assert isinstance(pong, wire.Unhealthy)
            assert "tool host host is unhealthy: 1 call did not come back (hang" in pong.reason
            refused = ask(sock, wire.ToolRequest(2, "s", 2, "echo", {"text": "x"}))
            assert refused == wire.Failed(2, pong.reason)
