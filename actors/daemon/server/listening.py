"""The daemon's listening socket kept from using up its descriptors.

libzmq's ``ipc://`` listener aborts the whole process when ``accept`` fails for want of a
descriptor (``ipc_listener.cpp``: EMFILE is not among the errors it tolerates), and every
connection takes one, whether its peer ever speaks or not. The daemon raises its soft limit
to the hard one at start (:func:`actors.wire.peer_guard.raise_fd_limit`); this keeps what is left
of it: on each accepted connection (a socket monitor event, read by the loop) it counts the
process's open descriptors, and past ``limit - headroom`` it stops listening (``unbind``,
which also drops the connections made through it: only a flood gets there). It listens again
once the count is down to half the limit. Both are logged.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import zmq

from actors.wire.loop import Loop, Timer

__all__ = ["Listening", "open_fds"]

log = logging.getLogger("loopd.daemon")

_RETRY_S = 0.1  # while not listening: how often to look whether to listen again
# Connections waiting to be accepted. libzmq's I/O thread accepts while this loop reacts, so
# a burst of this size (or a few) lands past the line before listening stops: the headroom
# below is several times it (seen: 35 over the line with 32, on a loaded 2-core machine).
BACKLOG = 16
_HEADROOM = 96  # descriptors kept free at least (a quarter of the limit when that is more)


def open_fds() -> int | None:
    """How many descriptors this process has open (None where that cannot be read)."""
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return None


class Listening:
    """Watches the accepted connections of ``sock`` (bound to ``where``) in ``loop``."""

    def __init__(self, loop: Loop, sock: zmq.Socket[Any], where: str, fd_limit: int) -> None:
        self.loop, self.sock, self.where = loop, sock, where
        self.limit = fd_limit
        self.high = fd_limit - max(_HEADROOM, fd_limit // 4)  # stop listening at this many
        self.listening = True
        self._retry: Timer | None = None
        self._estimate = open_fds() or 0  # + 1 per connection: counted again past the line
        self.monitor: zmq.Socket[Any] = sock.get_monitor_socket(zmq.EVENT_ACCEPTED)
        loop.add(self.monitor, self._accepted)

    def _accepted(self, _event: list[bytes]) -> None:
        self._estimate += 1  # closed ones are not counted: cheap, and errs on the safe side
        if not self.listening or self._estimate < self.high:
            return
        count = open_fds()
        if count is None:  # no way to count here: the raised limit is all there is
            return
        self._estimate = count
        if count >= self.high:
            self.listening = False
            log.error(
                "%d descriptors open of %d: the daemon stops listening on %s until "
                "connections close (a client opening connections without end?)",
                count, self.limit, self.where,
            )  # fmt: skip
            self.sock.unbind(self.where)
            self._retry = self.loop.call_later(_RETRY_S, self._again)

    def _again(self) -> None:
        count = open_fds()
        if count is not None and count > self.limit // 2:
            self._retry = self.loop.call_later(_RETRY_S, self._again)
            return
        try:
            self.sock.bind(self.where)
        except zmq.ZMQError as e:
            log.warning("cannot listen on %s again (%s); trying again", self.where, e)
            self._retry = self.loop.call_later(_RETRY_S, self._again)
            return
        self.listening = True
        self._estimate = count or 0
        log.warning("%s descriptors open: the daemon listens on %s again", count, self.where)

    def close(self) -> None:
        self.loop.cancel(self._retry)
        self.loop.remove(self.monitor)
        self.sock.disable_monitor()
        self.monitor.close(linger=0)
