"""How to reach one tool host: its endpoint, limits and keys, and the options of every socket."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import zmq

from actors.base.config import ToolsConfig
from actors.tools.protocol import wire
from actors.wire.peer_guard import new_routing_id

__all__ = ["PORT_GRACE_S", "CurveClient", "PortSettings", "configure"]

PORT_GRACE_S = 0.75  # past tools.timeout_s, so the host's own timeout answer arrives first


@dataclasses.dataclass(frozen=True, slots=True)
class CurveClient:
    """Keys to reach a CURVE host: its public key, and our key pair (Z85 bytes)."""

    server_key: bytes
    public: bytes
    secret: bytes


@dataclasses.dataclass(frozen=True, slots=True)
class PortSettings:
    name: str
    endpoint: str
    timeout_s: float = 60.0
    heartbeat_s: float = 2.0
    max_frame_bytes: int = wire.DEFAULT_MAX_FRAME
    curve: CurveClient | None = None

    def __post_init__(self) -> None:
        for key in ("timeout_s", "heartbeat_s"):
            value = getattr(self, key)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"tool port {self.name}: {key} = {value!r} must be positive")

    @classmethod
    def from_config(
        cls, name: str, endpoint: str, tools: ToolsConfig, curve: CurveClient | None = None
    ) -> PortSettings:
        return cls(name, endpoint, tools.timeout_s, tools.heartbeat_s, tools.max_frame_bytes, curve)

    @property
    def connect_wait_s(self) -> float:
        """How long a call waits for a host that is not connected before failing unsent."""
        return 3 * self.heartbeat_s


def configure(sock: zmq.Socket[Any], settings: PortSettings) -> None:
    """Options every DEALER to a host gets (the connection's and the callers')."""
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.ROUTING_ID, new_routing_id())  # its own: no guessable counted one
    sock.setsockopt(zmq.IMMEDIATE, 1)  # queue nothing for a host that is not there
    sock.setsockopt(zmq.MAXMSGSIZE, settings.max_frame_bytes)
    sock.setsockopt(zmq.RECONNECT_IVL_MAX, 2000)
    if settings.curve is not None:
        sock.curve_serverkey = settings.curve.server_key
        sock.curve_publickey = settings.curve.public
        sock.curve_secretkey = settings.curve.secret
