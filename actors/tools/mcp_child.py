"""Starts an MCP server so that it cannot outlive the tool host that started it.

The SDK's stdio client starts the server in a session of its own, so when a tool host is
killed (SIGKILL, OOM) neither the host's own cleanup nor the supervisor's session kill can
reach it, and a server that does not stop on stdin EOF (a wedged one) would live on.
The host therefore runs ``python mcp_child.py HOST_PID COMMAND...``: this asks Linux to
SIGKILL us when our parent dies (``PR_SET_PDEATHSIG``, kept across ``exec``), checks the
parent is still there, and ``exec``s the server in place (no extra process stays).
Elsewhere it only ``exec``s. Standard library only, run with ``python -I -S`` to start fast.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

__all__ = ["main"]

_PR_SET_PDEATHSIG = 1


def main(argv: list[str]) -> int:
    if len(argv) < 2 or not argv[0].isdigit():
        print("usage: mcp_child.py PARENT_PID COMMAND [ARG...]", file=sys.stderr)
        return 2
    parent, command = int(argv[0]), argv[1:]
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)  # best effort
    if os.getppid() != parent:  # the host died before the request above took effect
        return 1
    try:
        os.execvp(command[0], command)
    except OSError as e:
        print(f"cannot start the MCP server {command[0]!r}: {e}", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
