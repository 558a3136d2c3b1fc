"""A torn last record: reopening says how many bytes it cut, and the scan is linear.

Found by the attack review: reopening after a crash cut a torn tail silently
(the README promised it says how many bytes), and reading a crafted torn tail was quadratic
(1 MB of a repeated short pattern: 14 s), because every plausible frame start had zlib run
over its whole claimed payload.
"""

from __future__ import annotations

import io
import json
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from actors.base.errors import LogCorrupt
from actors.cli.main import main
from actors.log import tailscan
from actors.log.file import HEADER, SessionLog, frame
from actors.log.records import User
from tests.support.fake_llama import FakeLlama, answer
from tests.support.turn_rig import baseline

TORN = frame(User(content="a message the crash interrupted " * 20))[:-7]


@pytest.fixture
def env(tmp_path: Path) -> Iterator[dict[str, Any]]:
    config = tmp_path / "loopd.toml"
    config.write_text(
        f'[log]\ndir = "{tmp_path / "sessions"}"\n[tools]\nstandard = false\n'
        "[inference]\nretries = 0\ntimeout_s = 20\n"
    )
    with FakeLlama([answer("First."), answer("Second.")]) as fake:
        yield {"config": str(config), "url": fake.url,
               "log": tmp_path / "sessions" / "s" / "log.bin"}


def _crash_mid_append(env: dict[str, Any], capsys: Any) -> int:
    """A first run, then a write cut short: the log ends in a torn record."""
    assert main(["run", "one", "--session", "s", "--config", env["config"], "--url",
                 env["url"]]) == 0
    capsys.readouterr()
    size = env["log"].stat().st_size
    with env["log"].open("ab") as f:
        f.write(TORN)
    return size


def test_run_says_how_many_bytes_it_cut(env: dict[str, Any], capsys: Any) -> None:
    whole = _crash_mid_append(env, capsys)
    assert main(["run", "two", "--session", "s", "--config", env["config"], "--url",
                 env["url"]]) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert f"session s: the log ended in a torn record (a write cut short by a crash); cut " \
           f"{len(TORN):,} bytes, every whole record kept" in err
    assert env["log"].stat().st_size > whole  # cut, then the new turn appended


def test_run_json_has_a_torn_tail_event(env: dict[str, Any], capsys: Any) -> None:
    _crash_mid_append(env, capsys)
    assert main(["run", "two", "--json", "--session", "s", "--config", env["config"],
                 "--url", env["url"]]) == 0
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    torn = [e for e in events if e["event"] == "torn_tail"]
    assert torn == [{"event": "torn_tail", "session": "s", "cut_bytes": len(TORN)}]
    assert events.index(torn[0]) < next(i for i, e in enumerate(events) if e["event"] == "answer")


def test_chat_says_how_many_bytes_it_cut(
    env: dict[str, Any], capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    _crash_mid_append(env, capsys)
    monkeypatch.setattr("sys.stdin", io.StringIO(""))  # Ctrl-D at the first prompt
    assert main(["chat", "--session", "s", "--config", env["config"], "--url", env["url"]]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert f"cut {len(TORN):,} bytes, every whole record kept" in out


def test_a_clean_reopen_says_nothing(env: dict[str, Any], capsys: Any) -> None:
    for message in ("one", "two"):
        assert main(["run", message, "--session", "s", "--config", env["config"],
                     "--url", env["url"]]) == 0
    assert "torn" not in capsys.readouterr().err


def test_log_show_says_how_many_bytes_are_torn_and_cuts_nothing(
    env: dict[str, Any], capsys: Any
) -> None:
    _crash_mid_append(env, capsys)
    size = env["log"].stat().st_size
    assert main(["log", "show", "s", "--config", env["config"]]) == 0
    captured = capsys.readouterr()
    err = " ".join(captured.err.split())
    assert f"the log ends in {len(TORN):,} bytes that are not a whole record" in err
    assert "One." not in captured.out and "one" in captured.out  # the whole records shown
    assert env["log"].stat().st_size == size  # a reader cuts nothing
    assert main(["log", "show", "s", "--json", "--config", env["config"]]) == 0
    captured = capsys.readouterr()
    assert all("kind" in json.loads(line) for line in captured.out.splitlines())
    assert f"{len(TORN):,} bytes" in " ".join(captured.err.split())


# --- the scan is linear ------------------------------------------------------------------------

# A frame header claiming a 524,416-byte payload that starts like a msgpack map, every 8 bytes:
# the scan's worst case before, zlib over half a megabyte at each of ~60,000 offsets per MB.
PATTERN = bytes([0x80, 0x00, 0x08, 0x00, 0x01, 0x02, 0x03, 0x04])
MB = 1 << 20


class _Counted:
    """zlib.crc32 counting the bytes it is given (the scan's work)."""

    def __init__(self) -> None:
        self.bytes = 0
        self.real = zlib.crc32

    def __call__(self, data: Any, value: int = 0) -> int:
        self.bytes += len(data)
        return self.real(data, value)


def _crafted_log(path: Path, size: int) -> tuple[int, int]:
    log, _ = SessionLog.open(path, baseline=baseline())
    with log:
        log.append(User(content="before the crash"))
    whole = path.stat().st_size
    tail = PATTERN * (size // len(PATTERN))
    with path.open("ab") as f:
        f.write(tail)
    return whole, len(tail)


@pytest.mark.parametrize("size", [MB // 4, MB])
def test_the_torn_tail_scan_is_linear(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: int
) -> None:
    path = tmp_path / "s" / "log.bin"
    whole, tail = _crafted_log(path, size)
    counted = _Counted()
    shifts: list[int] = []
    real_shift = tailscan.shift
    monkeypatch.setattr(zlib, "crc32", counted)
    monkeypatch.setattr(tailscan, "shift", lambda x, m: shifts.append(m) or real_shift(x, m))
    log, report = SessionLog.open(path)
    log.close()
    assert report.cut_bytes == tail
    assert path.stat().st_size == whole
    # Each byte of the file CRC'd at most twice (replay and the scan's one pass), and at
    # most one table walk (27 steps) per byte: work in proportion to the size, not its square.
    assert counted.bytes <= 2 * (whole + tail)
    assert len(shifts) <= tail


def test_the_scan_still_finds_a_valid_frame_after_a_crafted_stretch(tmp_path: Path) -> None:
    """Corruption followed by a whole record is still refused, however the bytes look."""
    path = tmp_path / "s" / "log.bin"
    whole, _ = _crafted_log(path, MB // 8)
    later = frame(User(content="written after the corruption"))
    with path.open("ab") as f:
        f.write(later)
    with pytest.raises(LogCorrupt) as caught:
        SessionLog.open(path)
    assert caught.value.offset == whole
    assert f"a valid record follows at byte {path.stat().st_size - len(later)}" in str(
        caught.value
    )


def test_the_prefix_crc_matches_zlib() -> None:
    data = bytes(range(256)) * 40 + HEADER
    for s, e in [(0, 0), (0, 1), (3, 17), (100, 5000), (0, len(data)), (777, 10_000)]:
        for base in (0, s // 2, s):
            assert zlib.crc32(data[base:e]) ^ tailscan.shift(zlib.crc32(data[base:s]), e - s) \
                == zlib.crc32(data[s:e])
    payload = b"\x81\xa4kind\xa4user"
    planted = PATTERN * 64 + struct.pack("<II", len(payload), zlib.crc32(payload)) + payload
    assert tailscan.next_valid_frame(planted, 1, 1 << 26) == len(PATTERN) * 64
