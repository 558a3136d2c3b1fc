"""Starts a child process so that it cannot outlive the process that started it.

``python -I -S tether.py PARENT_PID COMMAND...`` asks Linux to SIGKILL us when our parent
dies (``PR_SET_PDEATHSIG``, kept across ``exec``), checks the parent is still there, and
``exec``s the command in place (no extra process stays). Used for what a SIGKILLed loopd
could otherwise leave running: the embedded llama-server, and MCP servers (the MCP SDK
starts them in a session of their own, out of reach of a host's own clean-up). Elsewhere
than Linux it only ``exec``s. Standard library only, so it starts fast.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

__all__ = ["SCRIPT", "main", "tethered"]

SCRIPT = os.path.abspath(__file__)  # run as ``python -I -S SCRIPT PARENT_PID COMMAND...``

_PR_SET_PDEATHSIG = 1


def tethered(command: list[str]) -> list[str]:
    """The command line that runs ``command`` tethered to this process (it dies with us)."""
    return [sys.executable, "-I", "-S", SCRIPT, str(os.getpid()), *command]


def main(argv: list[str]) -> int:
    if len(argv) < 2 or not argv[0].isdigit():
        print("usage: tether.py PARENT_PID COMMAND [ARG...]", file=sys.stderr)
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
        print(f"cannot start {command[0]!r}: {e}", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
