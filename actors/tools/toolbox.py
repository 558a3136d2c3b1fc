"""The session process's tool side: starts the tool hosts, connects their ports, and stops
them all.

:meth:`Toolbox.start` reads ``[tools]``:

- the standard hosts (``tools.standard``), each a separate process: ``files`` (read_file,
  list_dir, search_files, write_file, outline_file, find_definition), ``shell``
  (run_command) and ``web`` (fetch_url), so a runaway command cannot stall file reads, and
  fetched pages are handled apart;
- each ``[[tools.hosts]]`` entry: ``local`` (standard tools by name) and ``mcp`` (an MCP
  server behind a tool host) run here as child processes on ``ipc://`` sockets in a private
  run directory (mode 0700); ``remote`` ones are reached at their ``tcp://`` endpoint with
  CURVE keys.

It then waits, up to ``tools.start_timeout_s`` in all, for every host's tool list. A host
that does not come up is not a hang and not fatal: it is named in :attr:`Toolbox.problems`
(with the end of its log) and its port keeps trying, so its tools appear when it does. A
host that exits at once with its usage-error code (an MCP server refusing us, a closed
port) is not restarted, so start-up stops waiting for it then. Tools offered under a
qualified name (two hosts, one name: :class:`~actors.tools.registry.Registry`) are named in
:attr:`Toolbox.warnings`.

Each local host is supervised by its port actor (restarted with backoff when it dies, see
:mod:`actors.tools.port.tool_port`), runs with ``--parent-pid`` so it exits if the daemon is
killed, and leads a process session of its own, so :meth:`Toolbox.close` can kill everything it
and its tools started. Nothing is left running after ``close``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType

import psutil

from actors.base.config import Config, HostConfig, ToolsConfig
from actors.base.errors import ConfigError, KeyFileError
from actors.base.private_places import private_places
from actors.base.processes.trees import kill_session, kill_tree, loopd_env
from actors.tools.port import (
    CurveClient,
    HostLauncher,
    PortSettings,
    PortStatus,
    ToolPort,
    start_port,
    stop_ports,
)
from actors.tools.providers.mcp_settings import AUTH_ENV, AUTHORIZE_MARK, SERVER_ENV, McpAuth
from actors.tools.providers.sandbox import Bounds, Sandbox
from actors.tools.providers.web import ALLOW_PRIVATE_ENV
from actors.tools.registry import Registry
from actors.wire.curve import load_public, load_secret

__all__ = ["STANDARD_HOSTS", "Toolbox", "check_workspace", "host_argv"]

log = logging.getLogger("loopd.toolbox")

STANDARD_HOSTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("files", ("read_file", "list_dir", "search_files", "write_file", "outline_file",
               "find_definition")),
    ("shell", ("run_command",)),
    ("web", ("fetch_url",)),
)
_IPC_MAX = 100  # the ipc:// path limit on Linux is 107 bytes; stay well under


def host_argv(
    name: str,
    endpoint: str,
    tools: ToolsConfig,
    workspace: Path,
    *,
    standard: tuple[str, ...] = (),
    mcp_command: tuple[str, ...] = (),
    mcp_url: str = "",
    hide: tuple[str, ...] = (),
) -> tuple[str, ...]:
    """The command line of a local tool host (``hide``: loopd's own places, which its
    standard tools must not reach)."""
    argv = [
        sys.executable, "-m", "actors.tools.host", "--bind", endpoint, "--name", name,
        "--workspace", str(workspace), "--parent-pid", str(os.getpid()),
        "--timeout", repr(tools.timeout_s), "--max-calls", str(tools.max_concurrent_calls),
        "--max-frame-bytes", str(tools.max_frame_bytes),
        "--max-output-bytes", str(tools.max_output_bytes),
    ]  # fmt: skip
    if standard:
        argv += ["--tools", *standard]
        if hide:
            argv += ["--hide", *hide]
    if "run_command" in standard:
        shell = tools.shell
        argv += ["--sandbox", shell.sandbox, "--env", *shell.env]
        argv += ["--tmpfs-mb", str(shell.tmpfs_mb), "--memory-mb", str(shell.memory_mb),
                 "--processes", str(shell.processes), "--file-mb", str(shell.file_mb),
                 "--cpu-s", repr(shell.cpu_s)]
        if shell.network:
            argv.append("--network")
    # no --allow: every call that needs approval is decided by the session's gate, on where
    # it lands (a host-side allow would skip what the gate asks: a protected write, a call
    # a deny rule cannot check)
    if mcp_command:
        argv += ["--mcp", shlex.join(mcp_command)]
    if mcp_url:
        argv += ["--mcp-url", mcp_url]
    if mcp_command or mcp_url:
        argv += ["--elicitation", tools.elicitation]
    return tuple(argv)


def token_file(config: Config, host: str) -> Path:
    """Where an MCP host's OAuth tokens are kept: in loopd's data directory, one of its
    private places (hidden from the sandbox and the file tools), mode 0600."""
    return config.embedded.data_path / "mcp-auth" / f"{host}.json"


def mcp_auth(h: HostConfig, config: Config) -> McpAuth | None:
    """What an MCP host's entry says about authorization (None: nothing)."""
    if not h.url or not (h.headers or h.bearer or h.oauth):
        return None
    return McpAuth(
        headers=h.headers, bearer=h.bearer, oauth=h.oauth, client_id=h.oauth_client_id,
        client_secret=h.oauth_client_secret, private_key=h.oauth_private_key,
        signing_algorithm=h.oauth_signing_algorithm,
        client_metadata_url=h.oauth_client_metadata_url, scopes=h.oauth_scopes,
        redirect_port=h.oauth_redirect_port, authorize_timeout_s=h.oauth_timeout_s,
        token_file=str(token_file(config, h.name)) if h.oauth else "",
    )


def _shell_warnings(config: Config, workspace: Path) -> list[str]:
    """What to say at start about run_command's sandbox, when a local host runs it."""
    tools = config.tools
    names = [n for _, ns in STANDARD_HOSTS for n in ns] if tools.standard else []
    names += [n for h in tools.hosts if h.kind == "local" for n in h.tools]
    if "run_command" not in names:
        return []
    shell = tools.shell
    if shell.sandbox == "none":
        return [
            'run_command runs commands without a sandbox (tools.shell.sandbox = "none"): '
            "they can write anywhere you can, use the network, and outlive loopd if they "
            "detach (setsid)"
        ]
    sandbox = Sandbox(shell.sandbox, shell.network, shell.env, bounds=Bounds.of(shell))
    why = sandbox.check(os.environ, workspace) or sandbox.process_bound_problem()
    return [why] if why else []


def _run_dir(given: Path | None) -> tuple[Path, bool]:
    if given is not None:
        given.mkdir(parents=True, exist_ok=True)
        return given, False
    base = tempfile.gettempdir()
    if len(base) > 40:  # e.g. macOS's long $TMPDIR: ipc paths must stay short
        base = "/tmp"
    return Path(tempfile.mkdtemp(prefix="loopd-", dir=base)), True


def _curve(h: HostConfig, where: str) -> CurveClient:
    if not h.client_key:
        raise KeyFileError(
            f"{where}: a remote host needs client_key, this daemon's secret key file "
            "(make one with `loopd keys NAME`, and put NAME.key in the host's --allow-keys)"
        )
    public, secret = load_secret(h.client_key)
    return CurveClient(server_key=load_public(h.server_key), public=public, secret=secret)


def check_workspace(config: Config) -> Path:
    """The workspace, when the local tool hosts need one and it is a directory; else
    ConfigError. Checked before anything starts (the model server takes seconds)."""
    tools = config.tools
    workspace = config.workspace
    if config.uses_workspace and not workspace.is_dir():
        raise ConfigError(
            f"tools.workspace = {tools.workspace!r} (or --workspace): {workspace} is not a "
            "directory; create it or point tools.workspace at one"
        )
    return workspace


class Toolbox:
    """The running tool hosts and their ports; :attr:`registry` holds their tools."""

    def __init__(self, ports: list[ToolPort], run_dir: Path, owns_run_dir: bool) -> None:
        self.ports = ports
        self.registry = Registry(ports)
        self.problems: dict[str, str] = {}
        self.warnings: list[str] = []  # said at start (e.g. run_command without a sandbox)
        self.run_dir = run_dir
        # loopd's own places (and the run directory), which the local hosts' file tools refuse
        self.hidden: tuple[str, ...] = ()
        self._owns_run_dir = owns_run_dir
        self._closed = False
        self._sweep = True  # close() kills any host of this process still running
        self.on_authorize: Callable[[str, str], None] = lambda _host, _url: None

    def _authorize(self, host: str, url: str) -> None:
        log.warning("tool host %s: its MCP server needs authorization: open %s", host, url)
        self.on_authorize(host, url)

    @classmethod
    def start(
        cls, config: Config, *, run_dir: Path | None = None,
        on_authorize: Callable[[str, str], None] | None = None,
        server_env: Mapping[str, Mapping[str, str]] | None = None, sweep: bool = True,
    ) -> Toolbox:
        """Start the local hosts, connect every port, and wait (bounded) for their tools.

        ``on_authorize(host, url)``: an MCP server wants the person to authorize loopd at
        ``url`` (called from a reader thread, whenever the host says so, start-up or later).
        ``server_env``: host name -> variables its stdio MCP server gets. ``sweep``: whether
        :meth:`close` also kills every tool host of this process still running (the world's
        toolbox; not a session's own, beside which the world's hosts run on).
        """
        tools = config.tools
        workspace = check_workspace(config)
        standard_names = {name for name, _ in STANDARD_HOSTS} if tools.standard else set()
        clash = standard_names & {h.name for h in tools.hosts}
        if clash:
            raise ConfigError(
                f"tools.hosts: {', '.join(sorted(clash))} is the name of a standard host; "
                "rename it, or set tools.standard = false"
            )
        directory, owned = _run_dir(run_dir)
        os.chmod(directory, 0o700)
        box = cls([], directory, owned)
        box.on_authorize = on_authorize or (lambda _host, _url: None)
        box._sweep = sweep
        try:
            box.warnings += _shell_warnings(config, workspace)
            box._start_hosts(config, workspace, server_env or {})
            box.registry = Registry(box.ports)
            box._wait(tools.start_timeout_s)
            box.warnings += [r.notice() for r in box.registry.renamed()]
        except BaseException:
            box.close()
            raise
        return box

    def _endpoint(self, name: str) -> str:
        endpoint = f"ipc://{self.run_dir}/{name}.sock"
        if len(endpoint) > _IPC_MAX:
            raise ConfigError(f"run directory {self.run_dir} is too long for an ipc:// socket path")
        return endpoint

    def _start_local(
        self, name: str, endpoint: str, tools: ToolsConfig, argv: tuple[str, ...],
        extra_env: dict[str, str] | None = None, watch: bool = False,
    ) -> None:
        env = {**loopd_env(), ALLOW_PRIVATE_ENV: "1" if tools.web.allow_private else "0",
               **(extra_env or {})}

        def line(text: str) -> None:
            if text.startswith(AUTHORIZE_MARK):
                self._authorize(name, text.removeprefix(AUTHORIZE_MARK).strip())

        launcher = HostLauncher(argv, env=env, log_path=self.run_dir / f"{name}.log",
                                on_line=line if watch else None)
        settings = PortSettings.from_config(name, endpoint, tools)
        self.ports.append(start_port(settings, launcher=launcher))

    def _start_hosts(self, config: Config, workspace: Path,
                     server_env: Mapping[str, Mapping[str, str]]) -> None:
        tools = config.tools
        hide = self.hidden = (*private_places(config), str(self.run_dir))
        if tools.standard:
            for name, names in STANDARD_HOSTS:
                endpoint = self._endpoint(name)
                argv = host_argv(name, endpoint, tools, workspace, standard=names, hide=hide)
                self._start_local(name, endpoint, tools, argv)
        for i, h in enumerate(tools.hosts):
            where = f"tools.hosts[{i}] ({h.name})"
            if h.kind == "remote":
                try:
                    curve = _curve(h, where)
                except KeyFileError as e:
                    self.problems[h.name] = str(e)
                    log.error("%s", e)
                    continue
                settings = PortSettings.from_config(h.name, h.endpoint, tools, curve)
                self.ports.append(start_port(settings))
                continue
            endpoint = self._endpoint(h.name)
            extra: dict[str, str] = {}
            if h.kind == "mcp":
                argv = host_argv(
                    h.name, endpoint, tools, workspace, mcp_command=h.command, mcp_url=h.url
                )
                auth = mcp_auth(h, config)
                if auth is not None:  # references only; in its environment, not its argv
                    extra[AUTH_ENV] = auth.to_json()
                if server_env.get(h.name):
                    extra[SERVER_ENV] = json.dumps(dict(server_env[h.name]))
            else:
                argv = host_argv(h.name, endpoint, tools, workspace, standard=h.tools,
                                 hide=hide)
            self._start_local(h.name, endpoint, tools, argv, extra,
                              watch=h.oauth == "authorization_code")

    def _wait(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for port in self.ports:
            if port.wait_ready(max(0.0, deadline - time.monotonic())):
                continue
            status = port.status()
            if port.gave_up:
                why = f"its tool host {status.reason} at start and is not started again"
            else:
                why = f"no tool list within {timeout_s:g} s (tools.start_timeout_s): {status.state}"
                if status.reason:
                    why += f", {status.reason}"
            tail = self._log_tail(port.name)
            if port.settings.curve is not None:
                why += (
                    "; is the host running and reachable, is server_key its public key, and is "
                    "our public key in its --allow-keys directory?"
                )
            self.problems[port.name] = why + (f"; its log ends:\n{tail}" if tail else "")
            log.error("tool host %s: %s", port.name, self.problems[port.name])

    def _log_tail(self, name: str, lines: int = 8) -> str:
        path = self.run_dir / f"{name}.log"
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.strip().splitlines()[-lines:])

    def status(self) -> dict[str, PortStatus]:
        """Each host's state, tools, pid and restart count."""
        return {port.name: port.status() for port in self.ports}

    def close(self) -> None:
        """Stop every port and host process, and whatever they started. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        stop_ports(self.ports)
        if self._sweep:
            _sweep(os.getpid())
        if self._owns_run_dir:
            shutil.rmtree(self.run_dir, ignore_errors=True)

    def __enter__(self) -> Toolbox:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _sweep(parent_pid: int) -> None:
    """Kill any tool host this process started that is somehow still running."""
    mark = ["--parent-pid", str(parent_pid)]
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if "actors.tools.host" not in cmd:
            continue
        if any(cmd[i : i + 2] == mark for i in range(len(cmd) - 1)):
            log.warning("tool host pid %d was still running after close; killing it", p.pid)
            with contextlib.suppress(psutil.Error, OSError):
                kill_tree(p.pid)
                kill_session(p.pid)
