"""The MCP bridge's round trip, side by side with the native tool host's, in one run.

Four ways to run an ``echo`` tool, timed in interleaved rounds so that machine noise hits
them alike (value: median milliseconds per sequential call; ratio: against the native host):

- native: tool port -> tool host (StandardTools echo), the floor a tool call costs;
- MCP bridge: tool port -> tool host -> McpProvider -> stdio -> an MCP server's echo (the
  SDK test server, tests/tools/mcp_test_server.py; its echo does what the native one does);
- McpProvider.run in this process (no ZeroMQ, no host): the bridge without the port;
- the bare SDK: ``mcp.Client.call_tool`` over stdio on an asyncio loop, the reference for
  what any MCP client pays.

The echo server over streamable HTTP, through the bridge, without and with authorization (a
bearer token from the environment and a header, checked by the server on every request).
Also ``mcp-server-time``'s ``get_current_time`` through the bridge (a real server from
PyPI), and the start-up time of an MCP host (spawn until its tool list arrives) against a
native one. Run: ``.venv/bin/python -m scripts.bench mcp`` (needs the mcp extra and
mcp-server-time).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from actors.base.config import ToolsConfig
from actors.tools.port import HostLauncher, PortSettings, ToolPort, start_port
from actors.tools.protocol.wire import Result
from actors.tools.providers.mcp_settings import AUTH_ENV, McpAuth
from actors.tools.toolbox import host_argv

__all__ = ["run"]

ROOT = Path(__file__).resolve().parent.parent
ECHO_SERVER = (sys.executable, str(ROOT / "tests" / "tools" / "mcp_test_server.py"))
TIME_SERVER = (sys.executable, "-m", "mcp_server_time", "--local-timezone", "UTC")
ROUNDS = 5
PER_ROUND = 100  # calls per measure per round
WARMUP = 30
STARTS = 3  # host start-ups per kind
_TOKEN, _TOKEN_ENV = "bench-token", "LOOPD_BENCH_MCP_TOKEN"
SMOKE = {"ROUNDS": 1, "PER_ROUND": 3, "WARMUP": 2, "STARTS": 1}  # `bench --smoke`


@contextlib.contextmanager
def _http_server(token: str | None = None) -> Iterator[str]:
    """The echo server over streamable HTTP (with ``token``: refusing requests without
    it and ``X-Team: blue``); yields its url."""
    command = [*ECHO_SERVER, "--http", *(("--token", token) if token else ())]
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if not line.startswith("PORT "):
                raise RuntimeError(f"the HTTP echo server did not start: {line!r}")
            yield f"http://127.0.0.1:{int(line.split()[1])}/mcp"
        finally:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def _port(
    name: str, env: dict[str, str] | None = None, **kind: Any
) -> Iterator[tuple[ToolPort, float]]:
    """A ready port to a fresh host; yields it and the seconds it took to come up."""
    workdir = Path(tempfile.mkdtemp(prefix="loopd-bench-"))
    endpoint = f"ipc://{workdir}/{name}.sock"
    argv = host_argv(name, endpoint, ToolsConfig(), workdir, **kind)
    log_path = workdir / "host.log"
    started = time.perf_counter()
    launcher = HostLauncher(argv, log_path=log_path,
                            env={**os.environ, **env} if env is not None else None)
    port = start_port(PortSettings(name, endpoint), launcher=launcher)
    try:
        if not port.wait_ready(60):
            raise RuntimeError(f"host {name} did not come up: {log_path.read_text()[-2000:]}")
        yield port, time.perf_counter() - started
    finally:
        port.stop()
        for f in workdir.iterdir():
            f.unlink()
        workdir.rmdir()


def _caller(port: ToolPort, tool: str, arguments: dict[str, Any]) -> Callable[[int], None]:
    def call(i: int) -> None:
        answer = port.call(session="bench", call=i, tool=tool, arguments=arguments)
        if not isinstance(answer, Result):
            raise RuntimeError(f"{port.name}/{tool}: {answer}")

    return call


def _timed(call: Callable[[int], None], n: int, samples: list[float]) -> None:
    for i in range(n):
        t = time.perf_counter()
        call(i)
        samples.append((time.perf_counter() - t) * 1000)


def _bare_sdk(n: int, samples: list[float]) -> None:
    """n echo calls with the SDK's own client; only the calls are timed."""
    import anyio
    from mcp import Client, StdioServerParameters

    async def main() -> None:
        params = StdioServerParameters(command=ECHO_SERVER[0], args=list(ECHO_SERVER[1:]))
        async with Client(params, cache=None) as client:
            await client.list_tools()
            for _ in range(WARMUP):
                await client.call_tool("echo", {"text": "warm"})
            for _ in range(n):
                t = time.perf_counter()
                result = await client.call_tool("echo", {"text": "hello"})
                samples.append((time.perf_counter() - t) * 1000)
                if result.is_error:
                    raise RuntimeError(f"bare SDK echo failed: {result}")

    anyio.run(main)


def _row(name: str, samples: list[float], floor: float | None, note: str) -> dict[str, Any]:
    median = statistics.median(samples)
    p90 = statistics.quantiles(samples, n=10)[-1] if len(samples) >= 10 else max(samples)
    row: dict[str, Any] = {
        "name": name, "value": round(median, 4), "unit": "ms/call",
        "note": f"{note}; p90 {p90:.3f} ms, n={len(samples)}",
    }
    if floor:
        row["ratio"] = round(median / floor, 2)
    return row


def run() -> list[dict[str, Any]]:
    from actors.tools.providers.mcp import McpProvider

    has_time = importlib.util.find_spec("mcp_server_time") is not None

    native: list[float] = []
    bridge: list[float] = []
    in_process: list[float] = []
    bare: list[float] = []
    time_server: list[float] = []
    http: list[float] = []
    http_auth: list[float] = []
    with contextlib.ExitStack() as stack:
        native_port, _ = stack.enter_context(_port("native", standard=("echo",)))
        mcp_port, _ = stack.enter_context(_port("mcp", mcp_command=ECHO_SERVER))
        provider = stack.enter_context(McpProvider(list(ECHO_SERVER)))
        never = threading.Event()  # the contract's cancel, never set: no call here is cancelled
        calls: list[tuple[Callable[[int], None], list[float]]] = [
            (_caller(native_port, "echo", {"text": "hello"}), native),
            (_caller(mcp_port, "echo", {"text": "hello"}), bridge),
            (lambda i: _check(provider.run("echo", {"text": "hello"}, 30, never)), in_process),
        ]
        url = stack.enter_context(_http_server())
        http_port, _ = stack.enter_context(_port("http", mcp_url=url))
        guarded = stack.enter_context(_http_server(_TOKEN))
        auth = McpAuth(bearer=f"env:{_TOKEN_ENV}", headers=("X-Team: blue",))
        authed_port, _ = stack.enter_context(_port(
            "authed", env={AUTH_ENV: auth.to_json(), _TOKEN_ENV: _TOKEN}, mcp_url=guarded))
        calls += [(_caller(http_port, "echo", {"text": "hello"}), http),
                  (_caller(authed_port, "echo", {"text": "hello"}), http_auth)]
        if has_time:
            time_port, _ = stack.enter_context(_port("time", mcp_command=TIME_SERVER))
            tz = {"timezone": "UTC"}
            calls.append((_caller(time_port, "get_current_time", tz), time_server))
        for call, _samples in calls:
            _timed(call, WARMUP, [])
        for _ in range(ROUNDS):
            for call, samples in calls:
                _timed(call, PER_ROUND, samples)
            _bare_sdk(PER_ROUND, bare)

    native_starts: list[float] = []
    mcp_starts: list[float] = []
    for _ in range(STARTS):
        with _port("native", standard=("echo",)) as (_p, took):
            native_starts.append(took * 1000)
        with _port("mcp", mcp_command=ECHO_SERVER) as (_p, took):
            mcp_starts.append(took * 1000)

    floor = statistics.median(native)
    rows = [
        _row("native host echo round trip", native, floor, "port -> host -> echo"),
        _row("MCP bridge echo round trip", bridge, floor,
             "port -> host -> McpProvider -> stdio MCP server"),
        _row("McpProvider.run echo, in process", in_process, floor, "no port, no host"),
        _row("bare MCP stdio call (SDK Client)", bare, floor, "mcp.Client.call_tool, asyncio"),
    ]
    rows += [
        _row("MCP bridge over HTTP echo round trip", http, floor,
             "port -> host -> McpProvider -> streamable HTTP MCP server"),
        _row("MCP bridge over HTTP with auth echo round trip", http_auth, floor,
             "the same with a bearer token and a header, checked by the server; "
             f"{statistics.median(http_auth) / statistics.median(http):.2f}x the one without"),
    ]
    if time_server:
        rows.append(_row("mcp-server-time get_current_time via bridge", time_server, floor,
                         "port -> host -> mcp-server-time"))
    start_floor = statistics.median(native_starts)
    rows.append({"name": "native host start-up", "value": round(start_floor, 1), "unit": "ms",
                 "ratio": 1.0, "note": f"spawn until tool list, n={STARTS}"})
    rows.append({"name": "MCP host start-up", "value": round(statistics.median(mcp_starts), 1),
                 "unit": "ms", "ratio": round(statistics.median(mcp_starts) / start_floor, 2),
                 "note": f"host + MCP server handshake + tools/list, n={STARTS}"})
    return rows


def _check(answer: Any) -> None:
    if not isinstance(answer, Result):
        raise RuntimeError(f"McpProvider echo: {answer}")


if __name__ == "__main__":
    for r in run():
        print(r)
