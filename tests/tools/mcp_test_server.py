"""A tiny MCP server for loopd's tests: tools that crash, hang, fail and return non-text.

Written with the official SDK's server API (``MCPServer``) so the client side under test talks
to a real MCP implementation. Run as ``python tests/tools/mcp_test_server.py [--record FILE]
[--http]``. Every ``notifications/cancelled`` the server receives, and the start of each
``hang`` and ``wedge`` call, is appended to FILE as a JSON line, so a test can prove that a
call was cancelled on the server. ``--http`` serves streamable HTTP on a free loopback port
and prints ``PORT <n>`` once it listens.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import socket
import sys
import time
from typing import Any

import anyio
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import AudioContent, ImageContent, TextContent, ToolAnnotations
from mcp_types import ElicitRequest, ElicitRequestFormParams, ElicitResult, InputRequiredResult
from pydantic import BaseModel

__all__ = ["build"]

_READ_ONLY = ToolAnnotations(read_only_hint=True, open_world_hint=False)


class Point(BaseModel):
    x: int
    y: int


class Name(BaseModel):
    name: str = "Ada"


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def build(record: str | None) -> MCPServer:
    """The server; ``record`` is the file that receives each cancellation notice."""
    server = MCPServer("loopd-test", version="1")

    def note(entry: dict[str, Any]) -> None:
        if record is not None:
            with open(record, "a", encoding="utf-8") as f:
                f.write(json.dumps(entry) + "\n")

    async def record_cancel(
        ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        if ctx.method == "notifications/cancelled":
            note({"method": ctx.method, "params": ctx.params})
        return await call_next(ctx)

    server.middleware.append(record_cancel)

    async def break_the_schema(
        ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        result = await call_next(ctx)
        params = ctx.params if isinstance(ctx.params, dict) else {}
        if ctx.method == "tools/call" and params.get("name") == "bad_point":
            return {**result, "structuredContent": {"x": "not a number"}}  # type: ignore[dict-item]
        return result

    server.middleware.append(break_the_schema)

    @server.tool(annotations=_READ_ONLY)
    async def greet(ctx: Context) -> str | InputRequiredResult:
        """Ask the person for a name (elicitation; the form's default is "Ada").

        The 2026-07-28 way (the SDK client's choice): the call answers "input required" and
        the client calls again with the answer; the older era asks over the session.
        """
        if ctx.protocol_version != "2026-07-28":
            asked = await ctx.elicit("Whom shall I greet?", Name)
            return f"hello {asked.data.name}" if asked.action == "accept" else \
                f"nobody to greet ({asked.action})"
        answers = ctx.input_responses
        if not answers:
            form = ElicitRequestFormParams(message="Whom shall I greet?",
                                           requested_schema=Name.model_json_schema())
            return InputRequiredResult(input_requests={"who": ElicitRequest(params=form)})
        answer = answers["who"]
        assert isinstance(answer, ElicitResult)
        if answer.action == "accept" and answer.content:
            return f"hello {answer.content['name']}"
        return f"nobody to greet ({answer.action})"

    @server.tool(annotations=_READ_ONLY)
    async def steps(ctx: Context, n: int = 3) -> str:
        """Take ``n`` steps, telling the client of each (progress notifications)."""
        for i in range(1, n + 1):
            await ctx.report_progress(i, n, f"step {i}")
        return f"{n} steps taken"

    @server.tool(annotations=_READ_ONLY)
    async def grow(name: str, ctx: Context) -> str:
        """Add a tool called NAME (answering "I am NAME") and say the tools changed."""

        def new_tool() -> str:
            return f"I am {name}"

        server.add_tool(new_tool, name=name, description=f"A tool added later: {name}.",
                        annotations=_READ_ONLY)
        if ctx.protocol_version == "2026-07-28":
            await ctx.notify_tools_changed()
        else:
            await ctx.session.send_tool_list_changed()
        return f"added {name}"

    @server.resource("notes://today", name="today", description="what to do today")
    def today() -> str:
        return "buy milk"

    @server.tool(annotations=_READ_ONLY)
    def point() -> Point:
        """A point, as structured output."""
        return Point(x=1, y=2)

    @server.tool(annotations=_READ_ONLY)
    def bad_point() -> Point:
        """A point whose answer breaks its own output schema (rewritten on the way out)."""
        return Point(x=1, y=2)

    @server.tool(annotations=_READ_ONLY)
    def echo(text: str) -> str:
        """Answer with the text."""
        return text

    @server.tool(annotations=_READ_ONLY)
    def pid() -> str:
        """This server process's id."""
        return str(os.getpid())

    @server.tool(annotations=_READ_ONLY)
    def crash() -> str:
        """Kill this server process mid-call."""
        os._exit(3)

    @server.tool(annotations=_READ_ONLY)
    async def hang() -> str:
        """Never answer (cancellable: the server stays healthy)."""
        note({"method": "started", "tool": "hang"})
        await anyio.sleep_forever()
        return "unreachable"

    @server.tool(annotations=_READ_ONLY)
    async def wedge() -> str:
        """Block the server's event loop: the whole server stops answering."""
        note({"method": "started", "tool": "wedge"})
        time.sleep(3600)
        return "unreachable"

    @server.tool(annotations=_READ_ONLY)
    def fail() -> str:
        """An error the tool reports (isError)."""
        raise ToolError("the tool failed on purpose")

    @server.tool(annotations=_READ_ONLY)
    def media() -> list[TextContent | ImageContent | AudioContent]:
        """Text, an image and an audio clip."""
        return [
            TextContent(text="here are the files"),
            ImageContent(data=_b64(b"\x89PNG" + bytes(96)), mime_type="image/png"),
            AudioContent(data=_b64(bytes(1000)), mime_type="audio/wav"),
        ]

    @server.tool()
    def delete_all() -> str:
        """A tool without annotations: MCP's defaults make it destructive."""
        return "deleted"

    @server.tool(annotations=ToolAnnotations(read_only_hint=True, open_world_hint=True))
    def web() -> str:
        """Reads from the open world."""
        return "text from the web"

    return server


def _serve_http(server: MCPServer, token: str | None) -> None:
    import uvicorn
    from starlette.responses import Response

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)  # connections queue from here on, so PORT means ready
    print(f"PORT {sock.getsockname()[1]}", flush=True)
    app: Any = server.streamable_http_app(host="127.0.0.1")
    if token is not None:  # every request must carry it, and X-Team: blue
        inner = app

        async def app(scope: Any, receive: Any, send: Any) -> None:
            headers = dict(scope.get("headers") or ())
            if scope["type"] == "http" and (
                headers.get(b"authorization") != f"Bearer {token}".encode()
                or headers.get(b"x-team") != b"blue"
            ):
                deny = Response(status_code=401, headers={"WWW-Authenticate": "Bearer"})
                await deny(scope, receive, send)
                return
            await inner(scope, receive, send)

    config = uvicorn.Config(app, log_level="warning")
    anyio.run(lambda: uvicorn.Server(config).serve(sockets=[sock]))


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--record", help="append each notifications/cancelled here")
    parser.add_argument("--http", action="store_true", help="serve streamable HTTP")
    parser.add_argument("--token", help="over HTTP: refuse requests without this bearer token")
    args = parser.parse_args(argv)
    server = build(args.record)
    if args.http:
        _serve_http(server, args.token)
    else:
        server.run()


if __name__ == "__main__":
    main(sys.argv[1:])
