"""A ``loopd chat`` on a terminal (pexpect), shared by the CLI's and the daemon's tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pexpect

__all__ = ["json_records", "leave"]


def leave(child: pexpect.spawn) -> None:
    """Ctrl-D at the prompt: the chat ends, with exit status 0."""
    child.sendeof()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def json_records(config: Path, session: str) -> list[dict[str, Any]]:
    """Session ``session``'s log as ``loopd log show --json`` prints it, a record a line."""
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-m", "actors.cli", "log", "show", session, "--json", "--config",
         str(config)], cwd=root, capture_output=True, text=True, check=True,
        env={**os.environ, "PYTHONPATH": str(root)},
    ).stdout
    return [json.loads(line) for line in out.splitlines()]
