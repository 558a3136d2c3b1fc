"""Tool round trip: an echo tool through loopd's tool port, beside its floor and MCP stdio.

Three ways to call the same echo tool running in another process, measured in one run and
interleaved round by round (these machines are shared and noisy, so ratios taken side by
side are what count):

- **floor**: a bare pyzmq DEALER (here) and ROUTER (a child process) over ``ipc://``, one
  msgpack map each way; no framework, no threads;
- **loopd**: ``ToolPort.call`` to a real tool host (``--tools echo``) over ``ipc://``:
  the caller's own socket, correlation and timeout, the host's schema check and worker;
- **mcp**: the official ``mcp`` SDK, ``ClientSession.call_tool`` to an ``MCPServer`` echo
  tool over stdio.

Rows: p50 and p99 latency (us) and sequential calls/s of each; the loopd/floor ratio (goal:
at most 1.5x) and the mcp/loopd ratio (goal: at least 5x). Run: ``python -m scripts.bench tools``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgpack
import zmq

ROOT = Path(__file__).resolve().parent.parent
ROUNDS = 60
PER_ROUND = 50  # calls per system per round (MCP: a third of that)
WARMUP = 200
SMOKE = {"ROUNDS": 2, "PER_ROUND": 6, "WARMUP": 8}  # `bench --smoke`

_FLOOR_SERVER = """
import sys, msgpack, zmq
ctx = zmq.Context()
sock = ctx.socket(zmq.ROUTER)
sock.bind(sys.argv[1])
while True:
    peer, frame = sock.recv_multipart()
    req = msgpack.unpackb(frame)
    reply = {"v": 1, "kind": "result", "id": req["id"], "content": req["arguments"]["text"],
             "class": "public", "untrusted": False}
    sock.send_multipart([peer, msgpack.packb(reply)])
"""

_MCP_SERVER = """
from mcp.server.mcpserver import MCPServer
server = MCPServer("bench")

@server.tool()
def echo(text: str) -> str:
    \"\"\"Answer with the text.\"\"\"
    return text

server.run()
"""


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env


@contextlib.contextmanager
def _process(argv: list[str]) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(
        argv, cwd=ROOT, env=_env(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL
    )
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def _timed(call: Callable[[], Any], n: int, samples: list[float]) -> float:
    """Run ``call`` n times; append each latency (s); return the batch's wall time."""
    start = time.perf_counter()
    for _ in range(n):
        t = time.perf_counter()
        call()
        samples.append(time.perf_counter() - t)
    return time.perf_counter() - start


class _Floor:
    def __init__(self, endpoint: str) -> None:
        self.ctx: zmq.Context[Any] = zmq.Context()
        self.sock: zmq.Socket[Any] = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(endpoint)
        self.id = 0

    def call(self) -> None:
        self.id += 1
        req = {"v": 1, "kind": "request", "id": self.id, "session": "bench", "call": self.id,
               "tool": "echo", "arguments": {"text": "hello"}, "approved": False}  # fmt: skip
        self.sock.send(msgpack.packb(req))  # the same frame loopd's wire format makes
        reply = msgpack.unpackb(self.sock.recv())
        assert reply["content"] == "hello"

    def close(self) -> None:
        self.sock.close(linger=0)
        self.ctx.term()


class _Mcp:
    """An MCP stdio session driven from this thread, one call per ``call()``."""

    def __init__(self) -> None:
        from mcp import ClientSession, StdioServerParameters, stdio_client

        self.loop = asyncio.new_event_loop()
        self.stack = contextlib.AsyncExitStack()
        params = StdioServerParameters(command=sys.executable, args=["-c", _MCP_SERVER])

        async def open_session() -> Any:
            read, write = await self.stack.enter_async_context(stdio_client(params))
            session = await self.stack.enter_async_context(ClientSession(read, write))
            await session.initialize()
            return session

        started = time.perf_counter()
        self.session = self.loop.run_until_complete(open_session())
        self.start_s = time.perf_counter() - started

    def call(self) -> None:
        result = self.loop.run_until_complete(self.session.call_tool("echo", {"text": "hello"}))
        assert result.content[0].text == "hello"

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.loop.run_until_complete(self.stack.aclose())
        self.loop.close()


def _rows(
    name: str, samples: list[float], wall: float, count: int, note: str
) -> list[dict[str, Any]]:
    ordered = sorted(samples)
    p50 = statistics.median(ordered) * 1e6
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1e6
    return [
        {"name": f"{name} p50", "value": round(p50, 1), "unit": "us", "note": note},
        {"name": f"{name} p99", "value": round(p99, 1), "unit": "us"},
        {"name": f"{name} calls/s", "value": round(count / wall), "unit": "calls/s"},
    ]


def _ratio(name: str, value: float, note: str) -> dict[str, Any]:
    return {"name": name, "value": round(value, 2), "unit": "x", "ratio": value, "note": note}


_LABELS = {
    "floor": "floor: bare DEALER/ROUTER+msgpack, ipc",
    "host": "loopd host alone (bare DEALER client), ipc",
    "loopd": "loopd: tool port -> tool host, ipc",
    "mcp": "mcp: official SDK, stdio",
}


def _measure(systems: dict[str, Callable[[], None]]) -> dict[str, tuple[list[float], float, int]]:
    """Warm up, then interleave small batches so load changes hit every system alike."""
    out: dict[str, tuple[list[float], float, int]] = {name: ([], 0.0, 0) for name in systems}
    for name, call in systems.items():
        _timed(call, WARMUP // 4 if name == "mcp" else WARMUP, [])
    for _ in range(ROUNDS):
        for name, call in systems.items():
            n = PER_ROUND // 3 if name == "mcp" else PER_ROUND
            samples, wall, count = out[name]
            wall += _timed(call, n, samples)
            out[name] = (samples, wall, count + n)
    return out


def run() -> list[dict[str, Any]]:
    from actors.tools.port import PortSettings, start_port

    tmp = Path(tempfile.mkdtemp(prefix="lb-", dir="/tmp"))
    floor_ep, host_ep = f"ipc://{tmp}/floor.sock", f"ipc://{tmp}/host.sock"
    host_argv = [sys.executable, "-m", "actors.tools.host", "--bind", host_ep, "--tools", "echo",
                 "--parent-pid", str(os.getpid()), "--log-level", "WARNING"]  # fmt: skip
    mcp: _Mcp | None = None
    mcp_note = ""
    try:
        with _process([sys.executable, "-c", _FLOOR_SERVER, floor_ep]), _process(host_argv):
            floor, bare_host = _Floor(floor_ep), _Floor(host_ep)
            port = start_port(PortSettings("bench", host_ep, timeout_s=10, heartbeat_s=2))
            try:
                if not port.wait_ready(30):
                    raise RuntimeError("the bench tool host did not start")

                def loopd() -> None:
                    answer = port.call(
                        session="bench", call=1, tool="echo", arguments={"text": "hello"}
                    )
                    assert getattr(answer, "content", None) == "hello", answer

                try:
                    mcp = _Mcp()
                    mcp_note = f"server start + initialize {mcp.start_s:.2f} s"
                except ImportError as e:
                    mcp_note = f"skipped: {e} (pip install 'mcp>=2.3')"
                systems = {"floor": floor.call, "host": bare_host.call, "loopd": loopd}
                if mcp is not None:
                    systems["mcp"] = mcp.call
                results = _measure(systems)
            finally:
                port.stop()
                floor.close()
                bare_host.close()
                if mcp is not None:
                    mcp.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    rows: list[dict[str, Any]] = []
    for name, (samples, wall, count) in results.items():
        rows += _rows(_LABELS[name], samples, wall, count, mcp_note if name == "mcp" else "")
    p50 = {name: statistics.median(samples) for name, (samples, _, _) in results.items()}
    rows.append(_ratio("loopd p50 / floor p50", p50["loopd"] / p50["floor"], "goal <= 1.5x"))
    rows.append(
        _ratio("host alone p50 / floor p50", p50["host"] / p50["floor"], "the host's share")
    )
    if "mcp" in p50:
        rows.append(_ratio("mcp p50 / loopd p50", p50["mcp"] / p50["loopd"], "goal >= 5x"))
    else:
        rows.append({"name": "mcp", "value": None, "unit": "", "note": mcp_note})
    return rows


if __name__ == "__main__":
    for row in run():
        print(row)
