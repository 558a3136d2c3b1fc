"""Typed messages as msgpack maps, for every ZeroMQ protocol loopd speaks.

One message is one frame holding one msgpack map: ``v`` (the protocol's version), ``kind``,
and the message's fields by name. The peer may be buggy, old or hostile, so
:meth:`MessageCodec.decode` trusts nothing: the frame size is checked before msgpack sees
it, msgpack runs with small container limits, and every field is checked (missing and
unknown fields included). Anything wrong raises :class:`~actors.base.errors.WireError` with what
was wrong, and the message's ``id`` when one could be read so that the peer can be told
which request failed. The tool wire (``actors.tools.protocol.wire``) and the daemon's
client protocol (``actors.daemon.protocol``) are each a table of kinds for this codec.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import msgpack

from actors.base.errors import WireError
from actors.wire.fieldchecks import MAX_ID, Check

__all__ = ["Fields", "MessageCodec"]

# wire name -> (attribute name, check), per kind
Fields = Mapping[str, Mapping[str, tuple[str, Check]]]


class MessageCodec:
    """Encodes and decodes the messages of one protocol (its kinds and their fields)."""

    def __init__(
        self,
        *,
        name: str,
        version: int,
        kinds: Mapping[type[Any], str],
        fields: Fields,
        plain: Callable[[Any], Any] = lambda v: v,
        max_array: int = 100_000,
        max_map: int = 50_000,
    ) -> None:
        assert set(kinds.values()) == set(fields), "every kind needs its fields"
        self.name = name
        self.version = version
        self.kinds = dict(kinds)
        self.fields = fields
        self.by_kind = {k: cls for cls, k in kinds.items()}
        self._plain = plain
        self._max_array, self._max_map = max_array, max_map

    def encode(self, msg: Any) -> bytes:
        """The frame of one message; WireError if a field cannot go on the wire."""
        kind = self.kinds.get(type(msg))
        if kind is None:
            raise WireError(f"cannot encode {type(msg).__name__}: not a {self.name} message")
        body: dict[str, Any] = {"v": self.version, "kind": kind}
        for wire_name, (attr, check) in self.fields[kind].items():
            value = self._plain(getattr(msg, attr))
            try:
                check(value)
            except TypeError as e:
                raise WireError(f"{kind}.{wire_name}: {e}") from None
            body[wire_name] = value
        return self.pack(kind, body)

    def pack(self, kind: str, body: Mapping[str, Any]) -> bytes:
        """msgpack of an already checked body (a caller's fast path for a hot message)."""
        try:
            return msgpack.packb(body)
        except (TypeError, ValueError, OverflowError) as e:  # e.g. text with lone surrogates
            raise WireError(f"{kind}: cannot encode: {e}") from None

    def decode(self, frame: bytes, max_bytes: int) -> Any:
        """One message from a frame; WireError says what is wrong with it."""
        if not isinstance(frame, bytes | bytearray | memoryview):
            raise WireError(f"a frame must be bytes, got {type(frame).__name__}")
        if len(frame) > max_bytes:
            raise WireError(f"frame of {len(frame)} bytes is over the limit of {max_bytes} bytes")
        try:
            body = msgpack.unpackb(
                frame, max_array_len=self._max_array, max_map_len=self._max_map,
                strict_map_key=True,
            )  # fmt: skip
        except Exception as e:  # msgpack raises many unrelated types for bad input
            raise WireError(f"not a msgpack message: {type(e).__name__}: {e}") from None
        if type(body) is not dict:
            raise WireError(f"a message must be a msgpack map, got {type(body).__name__}")
        raw_id = body.get("id")
        known_id = raw_id if type(raw_id) is int and 0 <= raw_id <= MAX_ID else None
        version = body.get("v")
        if version != self.version or type(version) is not int:
            raise WireError(
                f"protocol version {version!r:.20} is not supported (this side speaks "
                f"{self.name} {self.version}); run the same loopd version on both ends",
                known_id,
            )
        kind = body.get("kind")
        fields = self.fields.get(kind) if type(kind) is str else None
        if fields is None:
            known = ", ".join(self.fields)
            raise WireError(f"unknown message kind {kind!r:.40}; known: {known}", known_id)
        if len(body) != len(fields) + 2 or not body.keys() >= fields.keys():  # usually not
            unknown = set(body) - set(fields) - {"v", "kind"}
            if unknown:
                names = ", ".join(sorted(str(k) for k in unknown))
                raise WireError(f"{kind}: unknown field(s) {names:.200}", known_id)
        values: dict[str, Any] = {}
        for wire_name, (attr, check) in fields.items():
            if wire_name not in body:
                raise WireError(f"{kind}.{wire_name}: missing", known_id)
            try:
                values[attr] = check(body[wire_name])
            except (TypeError, RecursionError) as e:
                raise WireError(f"{kind}.{wire_name}: {e}", known_id) from None
        return self.by_kind[str(kind)](**values)
