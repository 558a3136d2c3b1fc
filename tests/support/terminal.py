"""A ``loopd chat`` on a terminal (pexpect), shared by the CLI's and the daemon's tests."""

from __future__ import annotations

import pexpect

__all__ = ["leave"]


def leave(child: pexpect.spawn) -> None:
    """Ctrl-D at the prompt: the chat ends, with exit status 0."""
    child.sendeof()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
