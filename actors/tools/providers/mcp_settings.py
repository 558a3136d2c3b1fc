"""What a ``[[tools.hosts]]`` entry says about an MCP server's authorization, as references.

Kept apart from :mod:`actors.tools.providers.mcp_auth` (which runs it) so the session side
(:mod:`actors.tools.toolbox`) can build it without the MCP SDK installed. A value
``"env:NAME"`` is read from the environment and ``"file:PATH"`` from a file, when the tool
host resolves it; anything else is taken as written.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any, Literal

from actors.base.errors import McpError

__all__ = ["AUTHORIZE_MARK", "AUTH_ENV", "SERVER_ENV", "ElicitationMode", "McpAuth", "resolve"]

# The tool host's environment variable holding its McpAuth as JSON (an environment only its
# user can read, where a command line anyone can).
AUTH_ENV = "LOOPD_MCP_AUTH"
# The tool host's environment variable holding, as a JSON map, the variables its stdio MCP
# server gets besides the SDK's default environment (an editor's ``env`` of an ACP server;
# values may be secrets, so not on the command line either).
SERVER_ENV = "LOOPD_MCP_SERVER_ENV"
ElicitationMode = Literal["ask", "defaults", "decline"]
# The line a tool host writes to stderr when an MCP server needs the person to authorize
# loopd (the URL follows); the session side watches for it (actors.tools.toolbox).
AUTHORIZE_MARK = "loopd toolhost: authorize at "


def resolve(value: str, what: str) -> str:
    """``env:NAME`` from the environment, ``file:PATH`` from a file, else ``value`` itself."""
    kind, sep, ref = value.partition(":")
    if sep and kind == "env":
        found = os.environ.get(ref)
        if found is None:
            raise McpError(f"{what} names the environment variable {ref}, which is not set")
        return found
    if sep and kind == "file":
        try:
            return Path(ref).expanduser().read_text(encoding="utf-8").strip()
        except OSError as e:
            raise McpError(f"{what} names the file {ref}, which cannot be read: {e}") from None
    return value


@dataclasses.dataclass(frozen=True, slots=True)
class McpAuth:
    """An MCP host's authorization, as references (see the module's docstring)."""

    headers: tuple[str, ...] = ()  # "Name: value"
    bearer: str = ""
    oauth: Literal["", "authorization_code", "client_credentials"] = ""
    client_id: str = ""  # a pre-registered client; "": dynamic registration (or CIMD)
    client_secret: str = ""
    # client_credentials with private_key_jwt (RFC 7523) instead of a secret: the PEM key
    private_key: str = ""
    signing_algorithm: str = "ES256"
    client_metadata_url: str = ""  # CIMD: an https URL used as the client id where supported
    scopes: tuple[str, ...] = ()  # "": the server's own choice
    redirect_port: int = 0  # the loopback listener's port; 0: any free one
    token_file: str = ""  # "": tokens kept in memory only
    authorize_timeout_s: float = 300.0  # how long the person has to authorize

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> McpAuth:
        raw = json.loads(text)
        if not isinstance(raw, dict):
            raise McpError(f"{AUTH_ENV} is not a JSON object")
        names = {f.name for f in dataclasses.fields(cls)}
        kwargs: dict[str, Any] = {
            k: tuple(v) if isinstance(v, list) else v for k, v in raw.items() if k in names
        }
        return cls(**kwargs)

    @property
    def empty(self) -> bool:
        return self == McpAuth()

    def header_values(self, label: str) -> dict[str, str]:
        """The static headers with their values resolved (never logged)."""
        out: dict[str, str] = {}
        for line in self.headers:
            name, sep, value = line.partition(":")
            if not sep or not name.strip():
                raise McpError(
                    f"MCP server {label}: header {name.strip()!r} must be written "
                    '"Name: value" (value may be env:NAME or file:PATH)'
                )
            out[name.strip()] = resolve(value.strip(), f"MCP server {label}: header {name.strip()}")
        if self.bearer:
            token = resolve(self.bearer, f"MCP server {label}: bearer")
            out["Authorization"] = f"Bearer {token}"
        return out
