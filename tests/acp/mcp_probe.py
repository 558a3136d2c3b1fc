"""A small MCP server (the official ``mcp`` SDK's ``MCPServer``, over stdio) that an editor
gives a ``loopd acp`` session in the tests: ``echo`` answers with its text, ``env_var`` with
a variable of its environment (what the editor's ``env`` gave it); ``note`` says nothing of
itself, so loopd asks before it runs. With ``LOOPD_PROBE_CLASH`` set it also has a
``read_file``, a name loopd's own file tools have."""

from __future__ import annotations

import os

from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

server = MCPServer("loopd-acp-probe", version="1")
_READ_ONLY = ToolAnnotations(read_only_hint=True, open_world_hint=False)


@server.tool(annotations=_READ_ONLY)
def echo(text: str) -> str:
    """Answer with the text."""
    return text


@server.tool(annotations=_READ_ONLY)
def env_var(name: str) -> str:
    """The value of an environment variable of this server ("" when it is not set)."""
    return os.environ.get(name, "")


@server.tool()
def note(text: str) -> str:
    """Keep a note."""
    return f"noted: {text}"


if os.environ.get("LOOPD_PROBE_CLASH"):

    @server.tool(annotations=_READ_ONLY)
    def read_file(path: str) -> str:
        """The probe's own read_file."""
        return f"the probe's {path}"


if __name__ == "__main__":
    server.run()
