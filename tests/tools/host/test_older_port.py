"""A tool port written from the tool wire's document as it stood before approvals: it sends
no ``approved``. Spoken by hand (raw pyzmq and msgpack, none of loopd's codec) to a real
tool host process running the standard file tools, under the same ``v: 1``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
import zmq

from tests.tools.hostkit import short_dir, spawn_host


@pytest.fixture(scope="module")
def older_port() -> Iterator[tuple[zmq.Socket[Any], Path]]:
    """A DEALER connected to a host of read_file and write_file, and the host's workspace."""
    with short_dir() as d:
        workspace = d / "ws"
        workspace.mkdir()
        (workspace / "notes.txt").write_text("hello from before approvals\n", encoding="utf-8")
        endpoint = f"ipc://{d}/h.sock"
        args = ("--tools", "read_file", "write_file", "--workspace", str(workspace))
        with spawn_host(endpoint, *args, log=d / "host.log"):
            ctx: zmq.Context[Any] = zmq.Context()
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(endpoint)
            try:
                tools = _ask(sock, {"v": 1, "kind": "hello"}, timeout=30)
                assert tools["kind"] == "tools", tools
                yield sock, workspace
            finally:
                sock.close(linger=0)
                ctx.term()


def _ask(sock: zmq.Socket[Any], body: dict[str, Any], timeout: float = 10) -> dict[str, Any]:
    sock.send(msgpack.packb(body))
    assert sock.poll(int(timeout * 1000)), f"no answer to {body['kind']}"
    answer: dict[str, Any] = msgpack.unpackb(sock.recv())
    return answer


def _request(id: int, tool: str, **arguments: Any) -> dict[str, Any]:
    """A request as the document before approvals had it: no ``approved``."""
    return {"v": 1, "kind": "request", "id": id, "session": "old", "call": id, "tool": tool,
            "arguments": arguments}  # fmt: skip


def test_a_request_without_approved_gets_its_call_run(
    older_port: tuple[zmq.Socket[Any], Path],
) -> None:
    sock, _ = older_port
    answer = _ask(sock, _request(1, "read_file", path="notes.txt"))
    assert answer["kind"] == "result", answer
    assert answer["id"] == 1
    assert "hello from before approvals" in answer["content"]


def test_a_request_without_approved_is_not_approved(
    older_port: tuple[zmq.Socket[Any], Path],
) -> None:
    """The default is "not approved": a tool that needs approval is asked about, not run."""
    sock, workspace = older_port
    answer = _ask(sock, _request(2, "write_file", path="new.txt", content="x"))
    assert answer["kind"] == "pending_approval", answer
    assert answer["id"] == 2
    assert not (workspace / "new.txt").exists()
    approved = {**_request(3, "write_file", path="new.txt", content="x"), "approved": True}
    assert _ask(sock, approved)["kind"] == "result"  # today's port, approved: it runs
    assert (workspace / "new.txt").read_text(encoding="utf-8") == "x"
