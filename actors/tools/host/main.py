"""The tool host process: ``loopd toolhost --bind ENDPOINT --tools NAMES...``.

Also ``python -m actors.tools.host``. It builds the providers its flags name, binds the
ROUTER socket (with CURVE when given keys) and runs :class:`~actors.tools.host.server.Host`
until SIGTERM/SIGINT. With ``--parent-pid`` the host exits when that process is gone, so a
daemon killed with SIGKILL leaves no host behind. Bad flags or set-up exit with code 2,
which the daemon's supervisor takes as "do not restart".

Remote use: ``--curve-secret FILE --allow-keys DIR`` turns on CURVE encryption and client
authentication; a client whose public key is not in DIR is refused during the handshake, so
it gets no answer and no tool runs. The key directory is read again when an unknown key
knocks (at most once a second), so adding a client's ``.key`` file needs no restart.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import logging
import os
import shlex
import signal
import sys
from collections.abc import Callable
from typing import Any

import psutil
import zmq

from actors.base import startup, telemetry
from actors.base.config import ShellConfig
from actors.base.errors import KeyFileError, McpError, UsageError
from actors.base.processes.trees import is_alive
from actors.tools.host.server import Host, home_cpu, pin
from actors.tools.protocol import wire
from actors.tools.protocol.provider import ToolProvider
from actors.wire.curve import curve_server
from actors.wire.peer_guard import raise_fd_limit, seed_router_ids

__all__ = ["main"]

log = logging.getLogger("loopd.toolhost")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="loopd toolhost",
        description="Run a tool host: a process that runs tools for loopd over ZeroMQ.",
    )
    p.add_argument("--bind", required=True, help="ipc:///path/host.sock or tcp://ADDRESS:PORT")
    p.add_argument(
        "--name", default="", help="name used in messages and logs (default: from the tools)"
    )
    p.add_argument("--tools", nargs="*", default=[], metavar="NAME", help="standard tools to run")
    p.add_argument(
        "--provider",
        action="append",
        default=[],
        metavar="MODULE:ATTR",
        help="a callable returning a ToolProvider (repeatable)",
    )
    p.add_argument("--mcp", metavar="COMMAND", help="an MCP server's command line (stdio)")
    p.add_argument("--mcp-url", metavar="URL", help="an MCP server's streamable-HTTP URL "
                   "(its authorization, if any, as JSON in $LOOPD_MCP_AUTH)")
    p.add_argument("--elicitation", choices=("ask", "defaults", "decline"), default="ask",
                   help="an MCP server's questions: nobody can be asked here, so ask declines")
    p.add_argument("--workspace", default=".", help="root of the file tools and run_command")
    p.add_argument(
        "--allow", nargs="*", default=[], metavar="NAME",
        help="tools that run without approval (a write into a .git or to a loopd.toml is "
        "still asked for)",
    )
    p.add_argument("--parent-pid", type=int, help="exit when this process is gone")
    p.add_argument(
        "--timeout", type=float, default=60.0, help="seconds one call may run (default 60)"
    )
    p.add_argument("--max-calls", type=int, default=8, help="calls running at once (default 8)")
    p.add_argument("--max-frame-bytes", type=int, default=wire.DEFAULT_MAX_FRAME)
    p.add_argument("--max-output-bytes", type=int, default=1024 * 1024)
    p.add_argument(
        "--curve-secret", metavar="FILE", help="this host's .key_secret file (from loopd keys)"
    )
    p.add_argument(
        "--allow-keys", metavar="DIR", help="directory of the .key files of allowed clients"
    )
    p.add_argument(
        "--sandbox",
        choices=["bwrap", "none"],
        default="bwrap",
        help="where run_command runs: in bubblewrap (default) or without a sandbox",
    )
    p.add_argument(
        "--network", action="store_true", help="run_command's sandbox keeps the network"
    )
    p.add_argument(
        "--env",
        nargs="*",
        default=None,
        metavar="NAME",
        help="variables (fnmatch patterns) run_command gets from this host's environment",
    )
    shell = ShellConfig()
    p.add_argument("--hide", nargs="*", default=[], metavar="PATH",
                   help="loopd's own places: hidden from run_command, refused to the file tools")
    p.add_argument("--tmpfs-mb", type=int, default=shell.tmpfs_mb,
                   help="size of run_command's /tmp, /run, /dev/shm each (0: unbounded)")
    p.add_argument("--memory-mb", type=int, default=shell.memory_mb,
                   help="data memory of each process of run_command (0: unbounded)")
    p.add_argument("--processes", type=int, default=shell.processes,
                   help="processes and threads of one run_command at once (0: unbounded)")
    p.add_argument("--file-mb", type=int, default=shell.file_mb,
                   help="largest file one run_command may write (0: unbounded)")
    p.add_argument("--cpu-s", type=float, default=shell.cpu_s,
                   help="CPU seconds of each process of run_command (0: its time limit)")
    p.add_argument("--log-level", default="INFO")
    return p


def _providers(args: argparse.Namespace) -> list[ToolProvider]:
    providers: list[ToolProvider] = []
    if args.tools:
        from actors.base.config import DEFAULT_ENV
        from actors.tools.protocol.workspace import Workspace
        from actors.tools.providers.sandbox import Bounds, Sandbox
        from actors.tools.providers.standard import StandardTools

        # loopd's own places, and the directory of this host's ipc socket, are hidden
        hide = (*args.hide, *((os.path.dirname(args.bind[6:]),)
                              if args.bind.startswith("ipc://") else ()))
        workspace = Workspace(args.workspace, hidden=hide)
        env = DEFAULT_ENV if args.env is None else tuple(args.env)
        bounds = Bounds(args.tmpfs_mb, args.memory_mb, args.processes, args.file_mb, args.cpu_s)
        if min(bounds.tmpfs_mb, bounds.memory_mb, bounds.processes, bounds.file_mb,
               bounds.cpu_s) < 0:
            raise UsageError("--tmpfs-mb, --memory-mb, --processes, --file-mb and --cpu-s "
                             "must be 0 (no bound) or more")
        sandbox = Sandbox(args.sandbox, network=args.network, env=env, hide=hide, bounds=bounds)
        if "run_command" in args.tools:
            if args.sandbox == "none":
                log.warning("run_command runs commands WITHOUT a sandbox (--sandbox none)")
            elif why := (sandbox.check(os.environ, workspace.root)
                         or sandbox.process_bound_problem()):
                log.warning("%s", why)
        providers.append(
            StandardTools(
                args.tools,
                workspace=workspace,
                max_output_bytes=args.max_output_bytes,
                sandbox=sandbox,
            )
        )
    for ref in args.provider:
        module, _, attr = ref.partition(":")
        try:
            factory = getattr(importlib.import_module(module), attr or "provider")
        except (ImportError, AttributeError) as e:
            raise UsageError(
                f"--provider {ref}: cannot load it ({e}); give MODULE:ATTR of a factory"
            ) from None
        providers.append(factory())
    if args.mcp or args.mcp_url:
        try:
            from actors.tools.providers.mcp import McpProvider
        except ModuleNotFoundError as e:
            if e.name == "actors.tools.providers.mcp":
                raise UsageError(
                    "--mcp: this loopd has no MCP support "
                    "(actors/tools/providers/mcp.py is missing)"
                ) from None
            raise UsageError(
                f"--mcp needs the MCP SDK ({e}); install it: pip install 'loopd[mcp]'"
            ) from None
        from actors.tools.providers.mcp_settings import AUTH_ENV, SERVER_ENV, McpAuth

        command = shlex.split(args.mcp) if args.mcp else None
        auth = McpAuth.from_json(os.environ[AUTH_ENV]) if os.environ.get(AUTH_ENV) else None
        variables = json.loads(os.environ[SERVER_ENV]) if os.environ.get(SERVER_ENV) else None
        providers.append(
            McpProvider(command=command, url=args.mcp_url, max_output_bytes=args.max_output_bytes,
                        auth=auth, elicitation=args.elicitation, on_authorize=_say_authorize,
                        env=variables)
        )
    if not providers:
        raise UsageError("no tools: give --tools NAMES, --provider, --mcp or --mcp-url")
    return providers


def _say_authorize(url: str) -> None:
    """The authorization URL on stderr (the host's log, watched by the toolbox)."""
    from actors.tools.providers.mcp_settings import AUTHORIZE_MARK

    print(f"{AUTHORIZE_MARK}{url}", file=sys.stderr, flush=True)


def _parent_watch(pid: int) -> Callable[[], bool]:
    if os.getppid() == pid:
        return lambda: os.getppid() == pid  # reparented: the parent is gone (pid reuse-proof)
    try:
        parent = psutil.Process(pid)
    except psutil.Error:
        return lambda: False
    return lambda: is_alive(parent)  # a zombie parent is a dead one


def _socket(ctx: zmq.Context[Any], args: argparse.Namespace) -> tuple[zmq.Socket[Any], Any]:
    seed_router_ids()  # before the ROUTER: the ids it gives peers are nobody's guess
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    sock.setsockopt(zmq.MAXMSGSIZE, args.max_frame_bytes)
    sock.setsockopt(zmq.LINGER, 0)
    auth = None
    if args.curve_secret or args.allow_keys:
        if not (args.curve_secret and args.allow_keys):
            sock.close()
            raise UsageError(
                "--curve-secret and --allow-keys go together (the host's key and its clients' keys)"
            )
        try:
            auth = curve_server(ctx, sock, args.curve_secret, args.allow_keys)
        except (KeyFileError, UsageError) as e:
            sock.close()
            raise UsageError(str(e)) from None
    elif args.bind.startswith("tcp://"):
        log.warning("%s has no CURVE keys: anyone who can reach it can run its tools", args.bind)
    try:
        sock.bind(args.bind)
    except zmq.ZMQError as e:
        sock.close()
        if auth is not None:
            auth.stop()
        raise UsageError(f"cannot bind {args.bind}: {e}") from None
    return sock, auth


def main(argv: list[str]) -> int:
    """Run a tool host until SIGTERM/SIGINT or the parent's exit; 2 on bad usage."""
    args = _parser().parse_args(argv)
    name = args.name or "+".join(args.tools) or "host"
    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format=f"%(asctime)s toolhost[{name}] %(levelname)s %(message)s",
    )
    raise_fd_limit()  # every connection to the host is a descriptor
    telemetry.configure(False, service="loopd-toolhost")  # on when its parent's is
    providers: list[ToolProvider] = []
    ctx: zmq.Context[Any] | None = None
    auth = None
    cpu = home_cpu()
    try:
        providers = _providers(args)
        host = Host(
            providers,
            name=name,
            allow=frozenset(args.allow),
            timeout_s=args.timeout,
            max_calls=args.max_calls,
            max_frame_bytes=args.max_frame_bytes,
            cpu=cpu,
        )
        # After the providers (what they start stays free), before the context (its I/O
        # thread keeps to the loop's CPU).
        pin({cpu} if cpu is not None else None)
        ctx = zmq.Context()
        sock, auth = _socket(ctx, args)
    except (UsageError, McpError) as e:
        print(f"loopd toolhost: {e}", file=sys.stderr)
        for provider in providers:
            with contextlib.suppress(Exception):
                provider.close()
        if ctx is not None:
            ctx.term()
        return 2
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: host.request_stop())
    startup.settled()
    try:
        host.serve(sock, parent_alive=_parent_watch(args.parent_pid) if args.parent_pid else None)
    finally:
        if auth is not None:
            auth.stop()
        sock.close(linger=0)
        ctx.term()
    return 0

