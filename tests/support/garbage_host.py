"""A tool host process that answers Hello and Ping properly, and tool calls with garbage.

``python -m tests.support.garbage_host --bind ENDPOINT [--parent-pid PID]`` offers one tool,
``garbage(mode)``, and answers a call to it by ``mode``:

- ``bytes``: bytes that are not msgpack (no call id can be read from them);
- ``map``: a msgpack map with the call's id but the wrong fields;
- ``wrong_id``: a well-formed Result for another call;
- ``huge``: a frame over the port's ``MAXMSGSIZE`` (libzmq drops the connection);
- ``silent``: nothing at all (the host keeps answering pings).

What a real host never sends, so the tool port's handling of it can be seen from a turn.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import Any

import msgpack
import zmq

from actors.base.errors import WireError
from actors.tools.protocol import wire
from actors.tools.protocol.spec import ToolSpec

__all__ = ["MODES", "SPEC", "main", "serve"]

MODES = ("bytes", "map", "wrong_id", "huge", "silent")
SPEC = ToolSpec(
    name="garbage",
    description="Answers with garbage of the given kind.",
    parameters={"type": "object", "properties": {"mode": {"enum": list(MODES)}},
                "required": ["mode"]},
)  # fmt: skip


def _answer(request: wire.ToolRequest) -> bytes | None:
    mode = request.arguments.get("mode")
    if mode == "bytes":
        return b"\xc1\xc1\xc1 not msgpack \x00\xff"
    if mode == "map":
        return msgpack.packb({"v": wire.VERSION, "kind": "result", "id": request.id, "x": 1})
    if mode == "wrong_id":
        return wire.encode(wire.Result(request.id + 1000, "an answer to some other call"))
    if mode == "huge":
        return b"\x00" * (8 * 1024 * 1024)
    return None


def serve(argv: list[str] | None, specs: tuple[ToolSpec, ...],
          answer: Callable[[wire.ToolRequest], bytes | None], description: str) -> int:
    """A hand-written host's loop: ``--bind ENDPOINT [--parent-pid PID]`` from ``argv``;
    Hello gets ``specs``, Ping a Pong, a call what ``answer`` says (None: nothing)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--bind", required=True)
    parser.add_argument("--parent-pid", type=int)
    args = parser.parse_args(argv)
    ctx: zmq.Context[Any] = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(args.bind)
    tools = wire.encode(wire.Tools(specs))
    pong = wire.encode(wire.Pong())
    try:
        while args.parent_pid is None or os.getppid() == args.parent_pid:
            if not sock.poll(250):
                continue
            peer, frame = sock.recv_multipart()
            try:
                msg = wire.decode(frame)
            except WireError:
                continue
            reply: bytes | None = None
            if isinstance(msg, wire.Hello):
                reply = tools
            elif isinstance(msg, wire.Ping):
                reply = pong
            elif isinstance(msg, wire.ToolRequest):
                reply = answer(msg)
            if reply is not None:
                sock.send_multipart([peer, reply])
    finally:
        sock.close(linger=0)
        ctx.term()
    return 0


def main(argv: list[str] | None = None) -> int:
    return serve(argv, (SPEC,), _answer, __doc__.split("\n")[0])


if __name__ == "__main__":
    sys.exit(main())
