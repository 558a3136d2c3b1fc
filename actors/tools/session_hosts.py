"""A session's own tool hosts: the MCP servers a client gives one session (an editor's
``mcpServers`` in ACP), run beside the world's hosts and offered to that session alone.

They are tool hosts like the configured ``[[tools.hosts]]`` of kind ``mcp`` (the same host
process, tool port, approval gate and untrusted marking; :class:`~actors.tools.toolbox.Toolbox`
starts them), in a toolbox of the session's own that stops with it. The session's turns
use :attr:`SessionHosts.registry`: the world's hosts first, then these, so loopd's own tools
keep their names and a server's tool of the same name is offered as ``server__tool``.

Nothing a client passes stops the session from opening: a server that cannot start (its
command not found, a bad url, a name loopd's hosts have, a server that does not answer) is
one line of :attr:`SessionHosts.notes` naming it and the fix, and the others start.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
from collections.abc import Callable, Mapping, Sequence

from actors.base.config import Config, HostConfig
from actors.base.errors import ConfigError
from actors.tools.registry import Registry
from actors.tools.toolbox import Toolbox

__all__ = ["SessionHosts", "host_name"]

_FIX = "fix it in the client's MCP server settings and open the session again"


def host_name(name: str) -> str:
    """The tool host name of a server the client named ``name``: letters, digits, ``-`` and
    ``_`` (a socket's file name, and the ``host__tool`` prefix a model can call)."""
    return re.sub(r"[^A-Za-z0-9_-]+", "-", name).strip("-_")[:40]


class SessionHosts:
    """The running hosts of one session's own servers (:meth:`start`), stopped by
    :meth:`close`."""

    def __init__(self, registry: Registry, box: Toolbox | None, started: tuple[str, ...],
                 tools: tuple[str, ...], notes: tuple[str, ...]) -> None:
        self.registry, self.box = registry, box
        self.started = started  # the servers whose tools are offered
        self.tools = tools  # their tools, by the names the model calls them
        self.notes = notes  # one line per problem: the server and the fix

    @classmethod
    def start(
        cls, config: Config, servers: Sequence[tuple[HostConfig, Mapping[str, str]]],
        shared: Registry, on_authorize: Callable[[str, str], None] | None = None,
    ) -> SessionHosts:  # fmt: skip
        """Start ``servers`` (each a ``[[tools.hosts]]`` entry of kind ``mcp`` and the
        variables its stdio server gets) beside ``shared``, the world's tools; waits, up to
        ``tools.start_timeout_s``, for their tool lists."""
        taken = {port.name for port in shared.ports}
        notes: list[str] = []
        hosts: list[HostConfig] = []
        env: dict[str, Mapping[str, str]] = {}
        for given, variables in servers:
            h = dataclasses.replace(given, name=host_name(given.name))
            problem = _problem(given.name, h, taken)
            if problem:
                notes.append(problem)
                continue
            taken.add(h.name)
            hosts.append(h)
            env[h.name] = variables
        box = None
        if hosts:
            try:
                own = config.replace("tools", standard=False, hosts=tuple(hosts))
            except ConfigError as e:  # what the checks above do not foresee
                return cls(shared, None, (), (), (*notes, f"MCP servers not started: {e}"))
            box = Toolbox.start(own, on_authorize=on_authorize, server_env=env, sweep=False)
            notes += [f"MCP server {name} did not start: {_why(why)}; {_FIX}"
                      for name, why in box.problems.items()]
        mine = {port.name for port in box.ports} if box is not None else set()
        registry = Registry([*shared.ports, *(box.ports if box is not None else ())])
        notes += [f"tool {r.tool} of MCP server {r.host} is offered as {r.name}: loopd's tool "
                  f"host {r.holder} has a tool named {r.tool} and keeps that name (rename the "
                  "tool in the server to have it called by its own name)"
                  for r in registry.renamed() if r.host in mine]
        tools = tuple(sorted(spec.name for spec in registry.specs()
                             if (entry := registry.entry(spec.name)) and entry[1].name in mine))
        problems = box.problems if box is not None else {}
        started = tuple(h.name for h in hosts if h.name not in problems)
        return cls(registry, box, started, tools, tuple(notes))

    def close(self) -> None:
        """Stop the hosts and their servers (whatever they started). Safe to call twice."""
        if self.box is not None:
            self.box.close()


def _why(problem: str) -> str:
    """A toolbox's problem as one line: what happened, and the last line of the host's log
    (where a host says why: a refusal, a server that ended)."""
    first, *tail = problem.splitlines()
    first = first.removesuffix("; its log ends:")
    return f"{first}: {tail[-1].strip()}" if tail else first


def _problem(given: str, h: HostConfig, taken: set[str]) -> str:
    """Why server ``given`` (as host ``h``) cannot start; "": it can."""
    if not h.name:
        return (f"MCP server {given!r} has no name loopd can use (letters, digits, - or _); "
                f"rename it: {_FIX}")
    if h.name in taken:
        return (f"MCP server {given}: a tool host of this session already has the name "
                f"{h.name} (loopd's own, or another server given); rename the server: {_FIX}")
    if h.command:
        if shutil.which(h.command[0]) is None:
            return (f"MCP server {given}: its command {h.command[0]!r} was not found (not on "
                    f"PATH, not an executable file); is it installed? {_FIX}")
    elif not h.url.startswith(("http://", "https://")):
        return (f"MCP server {given}: its url {h.url!r} is not http:// or https://; {_FIX}")
    return ""
