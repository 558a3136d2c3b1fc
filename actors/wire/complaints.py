"""Warnings about bad frames from a peer, rate-limited: a peer that floods garbage fills no disk.

Every ZeroMQ server of loopd (the tool host, the daemon, the CURVE authenticator) logs what a
peer sent wrong through one of these.
"""

from __future__ import annotations

import logging
import time
from typing import Any

__all__ = ["Complaints"]

log = logging.getLogger("loopd.wire")


class Complaints:
    """Logs bad frames at WARNING, ``burst`` per ``window_s`` at most: a flood fills no disk."""

    def __init__(
        self, burst: int = 20, window_s: float = 10.0, logger: logging.Logger = log
    ) -> None:
        self.burst, self.window_s, self.log = burst, window_s, logger
        self.start, self.count, self.dropped = 0.0, 0, 0

    def __call__(self, message: str, *args: Any) -> None:
        now = time.monotonic()
        if now - self.start > self.window_s:
            if self.dropped:
                self.log.warning("%d more bad frames were not logged", self.dropped)
            self.start, self.count, self.dropped = now, 0, 0
        self.count += 1
        if self.count <= self.burst:
            self.log.warning(message, *args)
        else:
            self.dropped += 1
