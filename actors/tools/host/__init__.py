"""The tool host process. It imports ``actors.tools.protocol`` and its providers only:
no session, log, turn, inference or pykka code (tests/test_layers.py checks it)."""

from actors.tools.host.main import main

__all__ = ["main"]
