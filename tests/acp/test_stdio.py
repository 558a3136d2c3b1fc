"""The pure parts of loopd acp's wire: lines out of any chunking, the limit, the id of a
line too long to read, which messages the connection may take."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors.acp.stdio import HEAD_BYTES, LineSplitter, Oversized, check_message, id_in_head

_lines = st.lists(st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"")), max_size=12)


@given(lines=_lines, cuts=st.lists(st.integers(0, 600), max_size=8), limit=st.integers(1, 50),
       end_newline=st.booleans())
def test_lines_come_out_whole_however_the_bytes_are_cut(
    lines: list[bytes], cuts: list[int], limit: int, end_newline: bool
) -> None:
    data = b"\n".join(lines) + (b"\n" if end_newline and lines else b"")
    splitter = LineSplitter(limit)
    out: list[bytes | Oversized] = []
    start = 0
    for cut in sorted({c for c in cuts if c < len(data)}):
        out += splitter.feed(data[start:cut])
        start = cut
    out += splitter.feed(data[start:]) + splitter.end()
    expected: list[bytes | Oversized] = [
        line if len(line) <= limit else Oversized(line[:HEAD_BYTES], len(line))
        for line in (data.split(b"\n")[:-1] if data.endswith(b"\n") else data.split(b"\n"))
    ] if data else []
    assert out == expected


def test_an_oversized_line_keeps_only_its_head() -> None:
    splitter = LineSplitter(limit=10)
    out = [*splitter.feed(b"x" * 5000), *splitter.feed(b"y" * 5000 + b"\nok\n")]
    assert out == [Oversized(b"x" * HEAD_BYTES, 10_000), b"ok"]
    assert len(splitter._buf) == 0  # nothing held after the line


@pytest.mark.parametrize(("head", "rid"), [
    (b'{"jsonrpc":"2.0","id":12,"method":"session/prompt","params":{"x', 12),
    (b'{"id": "abc", "method"', "abc"),
    (b'{"method":"m","params":{"id":5,"text":"aaa', None),  # params' id is not the message's
    (b'{"jsonrpc":"2.0","method":"m","params":{"a":[1,{"id":3}]},"id":4}', 4),
    (b'{"jsonrpc":"2.0","id":1234', None),  # the number may go on: not whole
    (b'{"id":"a\\"b","x":1', 'a"b'),
    (b'{"id":true,', None),
    (b'{"id":null,', None),
    (b"garbage with \"id\": 3", None),
])  # fmt: skip
def test_the_id_of_a_line_too_long_to_read(head: bytes, rid: object) -> None:
    assert id_in_head(head) == rid


@pytest.mark.parametrize(("message", "problem"), [
    ({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}, None),
    ({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": "s"}}, None),
    ({"jsonrpc": "2.0", "id": 3, "result": {}}, None),
    ({"jsonrpc": "2.0", "id": 3, "error": {"code": 1, "message": "x"}}, None),
    ([{"id": 1}], (None, "ACP has no batches")),
    ("text", (None, "not str")),
    ({"id": [1], "method": "x"}, (None, "id must be")),
    ({"id": True, "method": "x"}, (None, "id must be")),
    ({"id": 2, "method": 5}, (2, "method must be a string")),
    ({"id": 2, "method": "x", "params": 5}, (2, "params must be")),
    ({"id": 2}, (2, "a message has a method")),
    ({}, (None, "a message has a method")),
])  # fmt: skip
def test_which_messages_the_connection_may_take(message: object, problem: object) -> None:
    found = check_message(json.loads(json.dumps(message)))
    if problem is None:
        assert found is None
    else:
        assert found is not None and problem is not None
        rid, text = problem  # type: ignore[misc]
        assert found[0] == rid and text in found[1]
