"""The session log's torn-tail scan: the first valid frame after a bad one, in linear time.

A frame at offset ``q`` is valid when its length ``L`` (u32 LE at ``q``) is 1..MAX_RECORD and
fits the file, its payload starts like a msgpack map, and ``crc32(data[q+8 : q+8+L])``
equals the u32 at ``q+4``. Running zlib over each candidate's payload costs the sum of the
candidates' lengths: quadratic on a crafted tail (1 MB of a short repeated pattern took
14 s). Here each candidate's CRC comes from two prefix CRCs instead:

    crc32(data[s:e]) == P[e] ^ A**(e - s)(P[s])      with P[i] = crc32(data[start:i])

where ``A`` is one zero byte through the CRC register, a linear map of 32 bits. The prefix
CRCs are one pass of zlib over the data; ``A**m`` is one table step per set bit of ``m``
(tables of ``A**(2**k)``, made once). So the scan reads each byte once and spends at most
27 table steps per candidate: linear in the size of the tail.
"""

from __future__ import annotations

import functools
import re
import struct
import zlib

__all__ = ["next_valid_frame", "shift"]

_FRAME = struct.Struct("<II")
_MASK = 0xFFFFFFFF
_LEVELS = 27  # A**(2**k) for k < 27 covers every length up to 2**27 - 1 > MAX_RECORD
# Every record is a msgpack map (fixmap, map16, map32): the byte after a frame header.
_MAP_START = re.compile(rb"[\x80-\x8f\xde\xdf]")


def _zero_byte(x: int) -> int:
    """A(x): the CRC register after one zero byte (zlib's pre- and post-inversion undone)."""
    return zlib.crc32(b"\0", x ^ _MASK) ^ _MASK


def _apply(table: list[int], x: int) -> int:
    return (table[x & 0xFF] ^ table[256 | (x >> 8) & 0xFF]
            ^ table[512 | (x >> 16) & 0xFF] ^ table[768 | x >> 24])  # fmt: skip


def _table(images: list[int]) -> list[int]:
    """The byte tables of a linear map given its images of the 32 unit vectors."""
    table = [0] * 1024
    for part in range(4):
        base = part * 256
        for b in range(1, 256):
            low = b & -b
            table[base | b] = table[base | (b ^ low)] ^ images[part * 8 + low.bit_length() - 1]
    return table


@functools.cache
def _tables() -> tuple[list[int], ...]:
    """Tables of A**(2**k) for k in 0.._LEVELS-1 (about 27,000 ints, made on first use)."""
    images = [_zero_byte(1 << i) for i in range(32)]
    tables = [_table(images)]
    for _ in range(1, _LEVELS):
        previous = tables[-1]
        images = [_apply(previous, _apply(previous, 1 << i)) for i in range(32)]
        tables.append(_table(images))
    return tuple(tables)


def shift(x: int, m: int) -> int:
    """A**m(x): the register ``x`` after ``m`` zero bytes; one table step per set bit of m."""
    tables = _tables()
    while m:
        low = m & -m
        t = tables[low.bit_length() - 1]
        x = t[x & 0xFF] ^ t[256 | (x >> 8) & 0xFF] ^ t[512 | (x >> 16) & 0xFF] ^ t[768 | x >> 24]
        m ^= low
    return x


def next_valid_frame(data: bytes, start: int, max_record: int) -> int | None:
    """The first offset >= ``start`` where a valid frame begins, or None."""
    n = len(data)
    unpack = _FRAME.unpack_from
    candidates: list[tuple[int, int, int]] = []  # (payload start, payload end, crc)
    for match in _MAP_START.finditer(data, start + 8):
        s = match.start()
        length, crc = unpack(data, s - 8)
        if 0 < length <= max_record and s + length <= n:
            candidates.append((s, s + length, crc))
    if not candidates:
        return None
    view = memoryview(data)
    prefix: dict[int, int] = {}
    running, at = 0, start
    for pos in sorted({c[0] for c in candidates}.union(c[1] for c in candidates)):
        running = zlib.crc32(view[at:pos], running)
        prefix[pos], at = running, pos
    for s, e, crc in candidates:
        if prefix[e] ^ shift(prefix[s], e - s) == crc:
            return s - 8
    return None
