"""loopd as a library: the client of ``loopd serve``, the config, the error root.

::

    import actors

    config = actors.load_config()            # the file, $LOOPD_CONFIG, else the defaults
    with actors.Client.from_config(config) as client:
        outcome = client.turn("notes", "What does notes.txt say?").run(print)
    # every failure loopd expects is an actors.LoopdError (its exit_code says which)

Everything else is internal and may change. ``Client`` is loaded when first asked for: this
file runs in every loopd process (a tool host imports ``actors.tools.host``), and none of
them but a client needs ZeroMQ's daemon client (``tests/test_public.py`` checks both).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from actors.base.config import Config
from actors.base.config import load as load_config
from actors.base.errors import LoopdError

if TYPE_CHECKING:
    from actors.daemon.client import Client

__all__ = ["Client", "Config", "LoopdError", "load_config"]


def __getattr__(name: str) -> object:
    """``actors.Client``, imported on first use (PEP 562)."""
    if name == "Client":
        from actors.daemon.client import Client

        return Client
    raise AttributeError(f"module 'actors' has no attribute {name!r}")
