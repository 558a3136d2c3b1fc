"""Fuzzing what reads outside input: the log reader, records, the tool host, config, dispatch.

Each property says which errors are the documented clean ones and that nothing else escapes:

- the log (``read_records``, ``SessionLog.open``) against arbitrary files, files with loopd's
  header and arbitrary frames, and real logs mutated (bytes flipped, set, inserted, deleted,
  the file cut): only ``SessionError`` (``LogCorrupt`` is one); and whatever opens is a prefix
  of the real log, never an invented or altered record; the opened log takes appends;
- a real log whose frame payload was changed *with its CRC fixed* (the record is whole but
  not loopd's): only ``SessionError``, and the records before it are kept;
- ``records.decode`` against arbitrary msgpack, near-records included: only ``RecordError``;
- a real tool host process against arbitrary bytes and arbitrary msgpack frames: it answers
  only valid messages, and still answers a ping after every frame;
- ``config.parse`` against arbitrary tables: only ``ConfigError``;
- ``dispatch`` against arbitrary tool names and argument text: never raises.

Already fuzzed elsewhere, not repeated: the wire decoder (tests/tools/protocol/test_wire.py,
bytes and msgpack) and the SSE parser (tests/inference/test_sse.py, bytes and JSON in SSE framing).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import math
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
import zmq
from hypothesis import assume, given
from hypothesis import strategies as st

from actors.base import config as cfg
from actors.base.errors import ConfigError, RecordError, SessionError
from actors.base.processes.trees import kill_tree
from actors.log.file import HEADER, SessionLog, frame, read_records
from actors.log.records import (
    Assistant,
    Baseline,
    CacheLoss,
    Record,
    ToolCall,
    ToolResult,
    Usage,
    User,
    decode,
    to_json,
)
from actors.tools.protocol import wire
from actors.tools.protocol.spec import ResultClass, ToolSpec
from actors.tools.registry import Local, Registry, Remote, dispatch
from tests.support.watch import HANG_S

ROOT = Path(__file__).resolve().parents[2]
T0 = dt.datetime(2026, 1, 2, 3, 4, 5, 600000, tzinfo=dt.UTC)


def _real_records() -> list[Record]:
    tool = {"type": "function", "function": {"name": "call_tool", "parameters": {}}}
    call = ToolCall(id="c1", name="call_tool", arguments='{"name": "read_file"}')
    usage = Usage(timings={"cache_n": 10, "prompt_n": 5}, reasoning_tokens=3,
                  thinking_capped=False, prompt_tokens=15, completion_tokens=7,
                  finish_reason="tool_calls", time=T0)  # fmt: skip
    return [
        Baseline(system="be brief", tools=(tool,), model="m", created=T0, time=T0),
        User(content="read it ✓", time=T0),
        Assistant(content=None, reasoning="thinking", tool_calls=(call,), time=T0),
        usage,
        ToolResult(call=1, tool_call_id="c1", content="x" * 700, class_=ResultClass.PUBLIC,
                   untrusted=False, truncated=False, time=T0),
        CacheLoss(expected=15, got=0, time=T0),
        Assistant(content="It says x.", reasoning=None, time=T0),
        usage,
        User(content="thanks", time=T0),
    ]


REAL = _real_records()
REAL_BYTES = HEADER + b"".join(frame(r) for r in REAL)
_ENDS = [len(HEADER)]
for _r in REAL:
    _ENDS.append(_ENDS[-1] + len(frame(_r)))


@contextlib.contextmanager
def log_file(data: bytes) -> Iterator[Path]:
    """``data`` as a session's log.bin in a fresh directory, removed after."""
    d = tempfile.mkdtemp(prefix="lfz-")
    try:
        path = Path(d) / "s" / "log.bin"
        path.parent.mkdir()
        path.write_bytes(data)
        yield path
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _open_all(data: bytes) -> tuple[tuple[Record, ...] | None, tuple[Record, ...] | None]:
    """(read_records, SessionLog.open) of ``data``: the records, or None on SessionError.

    Anything else escaping fails the property. A log that opens must also take an append
    and reopen with it.
    """
    with log_file(data) as path:
        try:
            read = read_records(path)
        except SessionError:
            read = None
        try:
            log, _ = SessionLog.open(path, fsync="never")
        except SessionError:
            return read, None
        with log:
            opened = log.records
            log.append(User(content="after", time=T0))
        assert read_records(path) == (*opened, User(content="after", time=T0))
        return read, opened


def _is_prefix(records: tuple[Record, ...] | None) -> bool:
    return records is None or list(records) == REAL[: len(records)]


@given(st.binary(max_size=600))
def test_arbitrary_files_give_only_session_errors(data: bytes) -> None:
    read, opened = _open_all(data)
    assert read is None and opened is None  # no baseline can be in random bytes


@given(st.lists(st.tuples(st.integers(0, 2000), st.binary(max_size=300)), max_size=4),
       st.binary(max_size=40))  # fmt: skip
def test_loopd_header_and_arbitrary_frames_give_only_session_errors(
    frames: list[tuple[int, bytes]], tail: bytes
) -> None:
    """Frames with plausible lengths and matching CRCs, so decoding is reached."""
    body = b"".join(
        struct.pack("<II", length, zlib.crc32(payload)) + payload for length, payload in frames
    )
    _open_all(HEADER + body + tail)


_pos = st.integers(0, len(REAL_BYTES))
mutation = st.one_of(
    st.tuples(st.just("flip"), _pos, st.integers(1, 255)),
    st.tuples(st.just("set"), _pos, st.integers(0, 255)),
    st.tuples(st.just("insert"), _pos, st.binary(min_size=1, max_size=16)),
    st.tuples(st.just("delete"), _pos, st.integers(1, 16)),  # less than any whole frame
    st.tuples(st.just("cut"), _pos),
    st.tuples(st.just("cut_at_frame"), st.integers(0, len(REAL)), st.integers(-9, 9)),
)


def _mutate(data: bytes, op: tuple[Any, ...]) -> bytes:
    b = bytearray(data)
    kind, at = op[0], op[1] % (len(b) + 1)
    if kind == "flip" and at < len(b):
        b[at] ^= op[2]
    elif kind == "set" and at < len(b):
        b[at] = op[2]
    elif kind == "insert":
        b[at:at] = op[2]
    elif kind == "delete":
        del b[at : at + op[2]]
    elif kind == "cut":
        del b[at:]
    elif kind == "cut_at_frame":  # near a frame boundary, where torn writes end
        del b[max(0, _ENDS[op[1]] + op[2]) :]
    return bytes(b)


@given(st.lists(mutation, min_size=1, max_size=4))
def test_mutated_real_logs_open_to_a_prefix_or_a_clean_error(ops: list[tuple[Any, ...]]) -> None:
    data = REAL_BYTES
    for op in ops:
        data = _mutate(data, op)
    read, opened = _open_all(data)
    assert _is_prefix(read), "the reader invented or altered a record"
    assert _is_prefix(opened), "open invented or altered a record"
    if read is not None and opened is not None:
        assert opened[: len(read)] == read or read[: len(opened)] == opened


@given(st.integers(1, len(REAL) - 1), st.binary(max_size=64), st.integers(0, 2000),
       st.integers(0, 64))  # fmt: skip
def test_a_whole_frame_that_is_not_loopds_is_refused_and_nothing_before_it_lost(
    index: int, insert: bytes, at: int, drop: int
) -> None:
    """The payload of frame ``index`` changed and its length and CRC fixed to match."""
    payload = bytearray(frame(REAL[index])[8:])
    at %= len(payload) + 1
    payload[at : at + drop] = insert
    assume(payload and bytes(payload) != frame(REAL[index])[8:])
    new = struct.pack("<II", len(payload), zlib.crc32(payload)) + payload
    data = REAL_BYTES[: _ENDS[index]] + new + REAL_BYTES[_ENDS[index + 1] :]
    _read, opened = _open_all(data)
    if opened is not None:  # it decoded as a (different) valid record
        assert list(opened[:index]) == REAL[:index]
        assert len(opened) == len(REAL)


# --- records.decode --------------------------------------------------------------------------

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.floats(), st.text(max_size=20),
    st.binary(max_size=20), st.sampled_from([T0, dt.datetime(1, 1, 1, tzinfo=dt.UTC)]),
    st.builds(msgpack.ExtType, st.integers(0, 127), st.binary(max_size=12)),
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner,
                                                                 max_size=4),
    max_leaves=10,
)  # fmt: skip
_FIELD_NAMES = sorted({k for r in REAL for k in to_json(r)} | {"expected", "got", "class"})


@st.composite
def near_records(draw: st.DrawFn) -> dict[str, Any]:
    """A real record's map with some fields replaced, dropped or added."""
    body: dict[str, Any] = dict(draw(st.sampled_from([to_json(r) for r in REAL])))
    body["time"] = T0
    for key in draw(st.lists(st.sampled_from(_FIELD_NAMES), max_size=3)):
        if draw(st.booleans()):
            body[key] = draw(values)
        else:
            body.pop(key, None)
    return body


def _packb(value: Any) -> bytes:
    try:
        return msgpack.packb(value, datetime=True)
    except (TypeError, ValueError, OverflowError):
        assume(False)
        raise AssertionError("unreachable") from None


@given(values | near_records())
def test_decode_of_arbitrary_msgpack_raises_only_record_error(value: Any) -> None:
    with contextlib.suppress(RecordError):
        decode(_packb(value))


@given(st.binary(max_size=200))
def test_decode_of_arbitrary_bytes_raises_only_record_error(data: bytes) -> None:
    with contextlib.suppress(RecordError):
        decode(data)


# --- a real tool host --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def host() -> Iterator[tuple[zmq.Socket[Any], subprocess.Popen[bytes]]]:
    """A tool host process running ``echo``, and a DEALER connected to it."""
    d = tempfile.mkdtemp(prefix="lfz-", dir="/tmp")
    endpoint = f"ipc://{d}/h.sock"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    proc = subprocess.Popen(
        [sys.executable, "-m", "actors.tools.host", "--bind", endpoint, "--tools", "echo",
         "--parent-pid", str(os.getpid()), "--max-frame-bytes", "65536",
         "--log-level", "ERROR"],
        cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    ctx: zmq.Context[Any] = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    try:
        sock.send(wire.encode(wire.Hello()))
        assert sock.poll(30_000), "the tool host did not start"
        assert isinstance(wire.decode(sock.recv()), wire.Tools)
        yield sock, proc
    finally:
        sock.close(linger=0)
        ctx.term()
        kill_tree(proc.pid)
        proc.wait(HANG_S)
        shutil.rmtree(d, ignore_errors=True)


_KINDS = ["hello", "tools", "request", "result", "failed", "denied", "pending_approval",
          "ping", "pong", "cancel"]  # fmt: skip
_WIRE_FIELDS = ["id", "session", "call", "tool", "arguments", "content", "class", "untrusted",
                "message", "reason", "prompt", "tools", "approved"]  # fmt: skip


@st.composite
def near_messages(draw: st.DrawFn) -> dict[str, Any]:
    """Maps shaped like wire messages: right or wrong version and kind, fields half right."""
    msg: dict[str, Any] = {
        "v": draw(st.sampled_from([wire.VERSION, 0, 2, "1", None])),
        "kind": draw(st.sampled_from(_KINDS) | st.text(max_size=8)),
    }
    if draw(st.booleans()):  # a real-looking call of the host's tool
        msg.update(id=draw(st.integers(0, 2**63)), session="s", call=1, tool="echo",
                   arguments={"text": draw(st.text(max_size=10))},
                   approved=draw(st.booleans()))  # fmt: skip
    for key in draw(st.lists(st.sampled_from(_WIRE_FIELDS), max_size=4)):
        msg[key] = draw(values)
    return msg


def _exchange(sock: zmq.Socket[Any], data: bytes) -> None:
    """Send ``data``, then a ping; every answer up to the pong must be a valid message."""
    sock.send(data)
    sock.send(wire.encode(wire.Ping()))
    while True:
        assert sock.poll(10_000), "the tool host stopped answering"
        if isinstance(wire.decode(sock.recv(), 65536), wire.Pong):
            return


@given(st.binary(max_size=2048))
def test_the_tool_host_survives_arbitrary_bytes(
    host: tuple[zmq.Socket[Any], subprocess.Popen[bytes]], data: bytes
) -> None:
    sock, proc = host
    _exchange(sock, data)
    assert proc.poll() is None


@given(values | near_messages())
def test_the_tool_host_survives_arbitrary_msgpack(
    host: tuple[zmq.Socket[Any], subprocess.Popen[bytes]], value: Any
) -> None:
    sock, proc = host
    _exchange(sock, _packb(value))
    assert proc.poll() is None


# --- config and dispatch -----------------------------------------------------------------------

_SECTIONS = {f: type(getattr(cfg.Config(), f)) for f in cfg.Config.__dataclass_fields__}
_CONFIG_KEYS = sorted(
    {k for t in _SECTIONS.values() for k in t.__dataclass_fields__}
    | set(cfg.HostConfig.__dataclass_fields__)
)
config_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(_CONFIG_KEYS) | st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)  # fmt: skip
tables = st.dictionaries(
    st.sampled_from(sorted(_SECTIONS)) | st.text(max_size=6),
    st.dictionaries(st.sampled_from(_CONFIG_KEYS) | st.text(max_size=6), config_values,
                    max_size=5),
    max_size=4,
)  # fmt: skip


def _numbers(config: cfg.Config) -> Iterator[tuple[str, Any]]:
    for section in _SECTIONS:
        part = getattr(config, section)
        for key in part.__dataclass_fields__:
            yield f"{section}.{key}", getattr(part, key)


@given(tables)
def test_config_parse_of_arbitrary_tables_raises_only_config_error(data: dict[str, Any]) -> None:
    """And a config that is accepted has only finite numbers: every limit is a limit."""
    try:
        config = cfg.parse(data)
    except ConfigError:
        return
    for key, value in _numbers(config):
        if isinstance(value, float):
            assert math.isfinite(value), key


def test_a_host_command_with_an_unclosed_quote_is_a_config_error() -> None:
    """Found by this suite (it was a bare ValueError: a traceback and exit 1); now fixed."""
    with pytest.raises(ConfigError, match=r"tools.hosts\[0\].command"):
        cfg.parse({"tools": {"hosts": [{"name": "m", "kind": "mcp", "command": "x 'open"}]}})


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize(
    ("section", "key"),
    [("inference", "timeout_s"), ("inference", "read_timeout_s"), ("tools", "timeout_s"),
     ("tools", "heartbeat_s")],
)  # fmt: skip
def test_a_limit_that_is_not_a_finite_number_is_refused(
    section: str, key: str, value: float
) -> None:
    """Found by this suite: NaN passed every minimum check and disabled the deadline."""
    with pytest.raises(ConfigError, match=f"{section}.{key} = .*finite"):
        cfg.parse({section: {key: value}})


class _Port:
    """A port double with one tool; dispatch only reads its specs."""

    name = "p"

    def specs(self) -> list[ToolSpec]:
        schema = {"type": "object", "properties": {"path": {"type": "string"}},
                  "required": ["path"]}  # fmt: skip
        return [ToolSpec(name="read_file", description="Read a file.", parameters=schema)]


_REGISTRY = Registry([_Port()])  # type: ignore[list-item]


@given(
    st.sampled_from(["find_tool", "call_tool", "read_file"]) | st.text(max_size=12),
    st.text(max_size=40)
    | values.map(lambda v: json.dumps(v, default=repr))
    | st.builds(lambda n, a: json.dumps({"name": n, "arguments": a}, default=repr),
                st.sampled_from(["read_file", "find_tool", "call_tool"]) | st.text(max_size=8),
                values),
)  # fmt: skip
def test_dispatch_never_raises(name: str, arguments: str) -> None:
    assert isinstance(dispatch(_REGISTRY, name, arguments), Local | Remote)
