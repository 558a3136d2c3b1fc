"""MCP servers as tool hosts: a ToolProvider that runs an MCP server's tools.

A tool host started with ``--mcp "COMMAND ..."`` or ``--mcp-url URL`` builds one
:class:`McpProvider`. Three pieces, each with one job:

- the sync/async bridge (:mod:`actors.tools.providers.asyncloop`): the official ``mcp`` SDK
  is asyncio, so it runs on a loop in a thread of its own and the host's worker threads
  can call ``run`` concurrently and block only themselves;
- the connection's life (:mod:`actors.tools.providers.mcp_link`): starting the server,
  replacing one that died or hung, cancelling a call that timed out;
- the mapping (:mod:`actors.tools.providers.mcp_mapping`): annotations to loopd's policy,
  results to text, and the messages.

Approval is not decided here: the tool host answers ``PendingApproval`` for a tool whose
spec says ``needs_approval`` (the session's rules or the person decide,
actors.approval.gate) before ``run`` is ever called.
"""

from __future__ import annotations

import concurrent.futures
import logging
import shlex
import shutil
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from actors.base.errors import McpError
from actors.tools.protocol import wire
from actors.tools.protocol.provider import ASK, PROGRESS
from actors.tools.protocol.spec import ToolSpec
from actors.tools.protocol.wire import Answer, Failed
from actors.tools.providers.asyncloop import LoopThread, Stopped
from actors.tools.providers.mcp_link import CLOSE_TIMEOUT_S, PROBE_TIMEOUT_S, McpLink
from actors.tools.providers.mcp_mapping import (
    resource_spec,
    strip_userinfo,
    timeout_message,
    tool_spec,
)
from actors.tools.providers.mcp_settings import ElicitationMode, McpAuth

__all__ = ["McpProvider"]

log = logging.getLogger("loopd.mcp")


class McpProvider:
    """Runs the tools of one MCP server (a command over stdio, or a streamable-HTTP URL).

    Construction starts the server and lists its tools, raising :class:`McpError` with
    the reason if that fails. ``max_output_bytes`` (``tools.max_output_bytes``) cuts a
    result's text, with a note saying so.
    """

    def __init__(
        self,
        command: Sequence[str] | None = None,
        url: str | None = None,
        *,
        connect_timeout_s: float = 30.0,
        probe_timeout_s: float = PROBE_TIMEOUT_S,
        max_output_bytes: int | None = None,
        auth: McpAuth | None = None,
        elicitation: ElicitationMode = "ask",
        on_authorize: Callable[[str], None] = lambda _url: None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        if (command is None) == (url is None):
            raise ValueError("McpProvider needs exactly one of command (stdio) or url (HTTP)")
        if command is not None:
            words = [] if isinstance(command, str) else list(command)
            if not words or not all(isinstance(c, str) for c in words):
                raise ValueError(
                    f"MCP server command {command!r}: must be a non-empty list of strings, "
                    'e.g. ["uvx", "mcp-server-time"]'
                )
            self.label = shlex.join(words)
            if shutil.which(words[0]) is None:
                raise McpError(
                    f"MCP server command {words[0]!r} was not found (not on PATH, not an "
                    "executable file); check the command in [[tools.hosts]] (is it installed?)"
                )
        else:
            assert url is not None
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"MCP server url {url!r}: must start with http:// or https://")
            words, self.label = None, strip_userinfo(url)
        self._max_output = max_output_bytes
        self._closed = False
        if auth is not None and auth.oauth == "authorization_code":
            connect_timeout_s += auth.authorize_timeout_s  # the person takes their time
        self._link = McpLink(self.label, command=words, url=url,
                             connect_timeout_s=connect_timeout_s, probe_timeout_s=probe_timeout_s,
                             auth=auth, elicitation=elicitation, on_authorize=on_authorize,
                             env=env)
        self._loop = LoopThread(f"mcp {self.label[:40]}")
        try:
            listing = self._loop.submit(self._link.first_listing())
            tools = listing.result(timeout=2 * connect_timeout_s + 5)
        except BaseException as e:
            self.close()
            if isinstance(e, concurrent.futures.TimeoutError):
                raise McpError(
                    f"MCP server {self.label} did not start within {connect_timeout_s:g} s"
                ) from None
            raise
        try:
            resources = self._loop.submit(self._link.resources()).result(
                timeout=connect_timeout_s + 5)
        except Exception:
            resources = []
        self._resources = resource_spec(resources, self.label, {t.name for t in tools})
        self._specs = [tool_spec(t) for t in tools]
        if self._resources is not None:
            self._specs.append(self._resources)
        self._by_name = {s.name: s for s in self._specs}
        self._on_change: Callable[[], None] = lambda: None
        log.info("MCP server %s speaks MCP %s; %d tools", self.label, self.protocol_version,
                 len(self._specs))
        self._link.on_tools = self._tools_changed

    def watch(self, on_change: Callable[[], None]) -> None:
        """Call ``on_change`` (from the provider's loop thread) when the server's tools
        change (MCP's tools/list_changed); :meth:`specs` then has the new list."""
        self._on_change = on_change

    def _tools_changed(self, tools: list[Any]) -> None:
        specs = [tool_spec(t) for t in tools]
        if self._resources is not None and self._resources.name not in {s.name for s in specs}:
            specs.append(self._resources)
        if specs == self._specs:
            return
        self._specs, self._by_name = specs, {s.name: s for s in specs}
        self._on_change()

    @property
    def protocol_version(self) -> str:
        """The MCP version the live session speaks ("" when none is open)."""
        return self._link.protocol_version

    @property
    def connected(self) -> bool:
        """Whether a live session is open (False once the server is gone, until the next call)."""
        return self._link.connected

    # --- ToolProvider ---

    def specs(self) -> list[ToolSpec]:
        return list(self._specs)

    def run(
        self, tool: str, arguments: Mapping[str, Any], timeout_s: float, cancel: threading.Event
    ) -> Answer:
        """One call; given up early when ``cancel`` is set (the server is told, as on a timeout)."""
        spec = self._by_name.get(tool)
        if spec is None:
            return Failed(message=f"MCP server {self.label} has no tool named {tool!r}")
        if self._closed:
            return Failed(message=f"MCP server {self.label} is closed")
        # Answer a little before the host gives up, so the message is ours and precise.
        own_s = max(0.001, timeout_s - min(0.5, timeout_s * 0.1))
        if spec is self._resources:
            uri = arguments.get("uri")
            if not isinstance(uri, str) or not uri:
                return Failed(message='read_resource needs "uri": one of the resources listed')
            read = self._link.read(uri, own_s, untrusted=spec.untrusted,
                                   max_output=self._max_output)
            got = self._loop.wait(read, timeout_s, cancel)
            return got if not isinstance(got, Stopped) else Failed(
                message=f"reading {uri} on MCP server {self.label} stopped: {got.name.lower()}")
        asker = ASK.get()
        # The host's clock stops while the person is asked; the SDK's and ours cannot, so
        # they get the person's time on top (the host still stops the call at its limit).
        room = asker.budget_s if asker is not None else 0.0
        progress = PROGRESS.get()
        if progress is not None:  # a call that reports progress may run longer (the host says)
            room += (wire.PROGRESS_MAX_TIMES - 1) * timeout_s
        call = self._link.call(tool, dict(arguments), own_s + room, timeout_s,
                               untrusted=spec.untrusted, max_output=self._max_output,
                               ask=asker, progress=progress)
        try:
            # the SDK sends notifications/cancelled when a stopped call's task is cancelled
            answer = self._loop.wait(call, timeout_s + room, cancel)
        except Exception as e:  # a bug on our side must still answer the call
            log.exception("MCP call %s on %s failed", tool, self.label)
            return Failed(message=f"MCP call {tool} on {self.label} failed: {e!r}")
        if answer is Stopped.CANCELLED:
            return Failed(message=f"the call to {tool} was cancelled")
        if answer is Stopped.TIMED_OUT:
            return Failed(message=timeout_message(tool, self.label, timeout_s))
        if answer is Stopped.CLOSED:
            return Failed(message=f"MCP server {self.label} was closed during the call")
        return answer

    def close(self) -> None:
        """Stop the server (the whole process tree, for a command) and the loop thread."""
        if self._closed:
            return
        self._closed = self._link.closed = True
        self._loop.close(self._link.shutdown, CLOSE_TIMEOUT_S + 2)

    def __enter__(self) -> McpProvider:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
