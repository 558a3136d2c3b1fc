"""Starting an MCP tool host behind a real tool port, for tests (and the turn's tests).

``mcp_port(command=[...])`` is a context manager: it starts ``python -m actors.tools.host
--mcp "COMMAND"`` through :func:`actors.tools.port.tool_port.start_port` (so the port supervises and
restarts the host, as the daemon does), waits until the host has listed its tools, yields
the :class:`~actors.tools.port.ToolPort`, and stops the port and host on the way out, even
when the test fails. The host's log goes to ``host.log`` in a fresh short directory (ipc
paths must stay under ~100 bytes), printed if the host does not come up.
"""

from __future__ import annotations

import contextlib
import http.server
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

from actors.tools.port import HostLauncher, PortSettings, ToolPort, start_port

__all__ = [
    "TEST_SERVER",
    "TIME_SERVER",
    "closed_port_url",
    "mcp_host_argv",
    "mcp_port",
    "refusing",
]

TEST_SERVER = Path(__file__).with_name("mcp_test_server.py")
TIME_SERVER = (sys.executable, "-m", "mcp_server_time", "--local-timezone", "UTC")


def mcp_host_argv(
    endpoint: str,
    *,
    command: Sequence[str] | None = None,
    url: str | None = None,
    name: str = "mcp",
    allow: Sequence[str] = (),
    timeout_s: float = 60.0,
) -> tuple[str, ...]:
    """The command line of a tool host that serves one MCP server's tools on ``endpoint``."""
    argv = [sys.executable, "-m", "actors.tools.host", "--bind", endpoint, "--name", name]
    if command is not None:
        argv += ["--mcp", shlex.join(command)]
    if url is not None:
        argv += ["--mcp-url", url]
    argv += ["--timeout", f"{timeout_s:g}", "--parent-pid", str(os.getpid())]
    if allow:
        argv += ["--allow", *allow]
    return tuple(argv)


@contextlib.contextmanager
def mcp_port(
    *,
    command: Sequence[str] | None = None,
    url: str | None = None,
    name: str = "mcp",
    allow: Sequence[str] = (),
    timeout_s: float = 60.0,  # a hang guard: a server started again takes seconds when busy
    ready_s: float = 60.0,
) -> Iterator[ToolPort]:
    """A ready port to a fresh MCP tool host; stopped (host and server too) on exit."""
    workdir = Path(tempfile.mkdtemp(prefix="loopd-mcp-"))
    endpoint = f"ipc://{workdir}/host.sock"
    log_path = workdir / "host.log"
    argv = mcp_host_argv(
        endpoint, command=command, url=url, name=name, allow=allow, timeout_s=timeout_s
    )
    settings = PortSettings(name=name, endpoint=endpoint, timeout_s=timeout_s)
    port = start_port(settings, launcher=HostLauncher(argv=argv, log_path=log_path))
    try:
        if not port.wait_ready(ready_s):
            log = log_path.read_text(errors="replace") if log_path.exists() else "(no log)"
            raise AssertionError(f"the MCP tool host did not come up in {ready_s:g} s:\n{log}")
        yield port
    finally:
        port.stop()
        shutil.rmtree(workdir, ignore_errors=True)


@contextlib.contextmanager
def refusing(status: int = 401, challenge: str = 'Bearer realm="test"') -> Iterator[str]:
    """The url of an HTTP server (a thread here) that answers every request with ``status``."""

    class Refuse(http.server.BaseHTTPRequestHandler):
        def _refuse(self) -> None:
            self.send_response(status)
            if challenge:
                self.send_header("WWW-Authenticate", challenge)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_POST = do_DELETE = _refuse

        def log_message(self, *_: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Refuse)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/mcp"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def closed_port_url() -> str:
    """A loopback url nothing listens on (a port just freed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/mcp"


@contextlib.contextmanager
def http_test_server(*args: str) -> Iterator[str]:
    """The test server over streamable HTTP (with ``args``), as its URL; its stderr kept in a
    file (a pipe nobody reads could fill and stall it) and shown if it does not start."""
    from tests.support.watch import HANG_S

    command = [sys.executable, str(TEST_SERVER), "--http", *args]
    with tempfile.TemporaryFile("w+") as err, \
            subprocess.Popen(command, stdout=subprocess.PIPE, stderr=err, text=True) as proc:
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if not line.startswith("PORT "):
                err.seek(0)
                raise AssertionError(f"the HTTP test server did not start: {line!r}; "
                                     f"its stderr ends: {err.read()[-2000:]!r}")
            yield f"http://127.0.0.1:{int(line.split()[1])}/mcp"
        finally:
            proc.kill()
            proc.wait(timeout=HANG_S)
