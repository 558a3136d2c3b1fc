"""The tool host process. It imports ``actors.tools.protocol`` and its providers only:
no session, log, turn, inference or pykka code (tests/test_layers.py checks it)."""

from actors.base import startup as _startup  # noqa: F401  first: before anything imports httpx
from actors.tools.host.main import main

__all__ = ["main"]
