"""What keeps a ZeroMQ server of loopd alive whatever its peers do with their connections.

Two ways a peer could make libzmq abort a whole process (seen on the daemon):

- **Routing ids.** A ROUTER names a peer that brings no routing id ``\\x00`` + a 32-bit
  counter, and inserts that name without checking it is free (``router.cpp``,
  ``identify_peer``; the insert asserts in ``socket_base.cpp``). A peer may claim any id,
  that form included, and the counter starts at libzmq's ``generate_random()``, which is C
  ``rand()``, which libzmq never seeds: the first such id is ``006b8b4567`` in every
  process. A peer that claims the next few ids makes the process abort when the next peer
  without an id connects. :func:`seed_router_ids` seeds ``rand()`` from the system's secret
  random source before the server's ROUTER is made, so nobody can tell which ids come next;
  loopd's own clients bring ids of their own (:func:`new_routing_id`: random, never of the
  reserved ``\\x00`` form), so they never take a counted one, and no peer can guess theirs.
  A peer claiming an id already connected is ignored by libzmq (no hand-over), and logs
  show only a short prefix of an id (:func:`short`).
- **Descriptors.** libzmq's ``ipc://`` listener asserts when ``accept`` fails with EMFILE
  (``ipc_listener.cpp``; the tcp listener tolerates it). :func:`raise_fd_limit` raises the
  soft limit to the hard one at start; a server also counts its connections and stops
  listening before they use up what is left (see :mod:`actors.daemon.server.loop`).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource

__all__ = ["new_routing_id", "raise_fd_limit", "seed_router_ids", "short"]

_ID_BYTES = 16


def seed_router_ids() -> None:
    """Seed C ``rand()`` (which numbers a ROUTER's peers) from the secret random source.

    Call it before making the ROUTER: its counter starts at the first ``rand()`` it draws."""
    with contextlib.suppress(OSError, AttributeError):  # no C library to reach: libzmq's own
        ctypes.CDLL(None).srand(ctypes.c_uint(int.from_bytes(os.urandom(4), "little")))


def new_routing_id() -> bytes:
    """A routing id for a DEALER of loopd's: 16 random bytes, the first never zero."""
    raw = os.urandom(_ID_BYTES)  # what secrets gives, without loading OpenSSL's hashlib
    return bytes([raw[0] or 1]) + raw[1:]


def short(peer: bytes) -> str:
    """A peer as logs show it: enough to tell peers apart, not enough to claim its id."""
    return peer[:4].hex()


def raise_fd_limit() -> int:
    """Raise this process's soft limit of open descriptors to its hard limit; the limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    return soft
