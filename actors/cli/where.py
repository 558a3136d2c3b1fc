"""Where a command's session runs: through the daemon or in this process, on which workspace.

A session keeps the workspace it was made with (:mod:`actors.session.workspace`): a command
given no ``--workspace`` runs it there, and says so when that is not the config's; one given
another is refused before anything starts (exit 2). ``--url``, ``--workspace`` and
``--log-dir`` describe a world of the command's own, so the command runs in this process;
when a daemon is running it says so, since this starts a second model server (and tool
hosts) beside the daemon's. Through the daemon, a session whose workspace is not the
daemon's runs in this process instead (said), and a new session is told the daemon's.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from actors.base import config as cfg
from actors.base.errors import UsageError
from actors.session.workspace import kept_workspace, other_workspace

__all__ = ["place"]


def place(
    args: argparse.Namespace, config: cfg.Config, say: Callable[[str], None]
) -> tuple[cfg.Config, Any]:
    """The config to run session ``args.session`` with, and a client of the daemon to run
    it through (None: in this process)."""
    from actors.daemon.client import find_daemon

    name = args.session
    kept = kept_workspace(config, name)
    if kept is not None and kept != config.workspace:
        if args.workspace:
            raise UsageError(other_workspace(name, kept, config.workspace))
        say(f"session {name} works on {kept}, the workspace it was made with")
        config = config.replace("tools", workspace=str(kept))
    own = [flag for flag, given in (("--url", args.url), ("--workspace", args.workspace),
                                    ("--log-dir", args.log_dir)) if given]
    if args.local:
        return config, None
    client = find_daemon(config)
    if client is None:
        return config, None
    if own:
        client.close()
        say(f"a loopd daemon is running, but {own[0]} gives this command a world of its own: "
            "it starts its own model server and tool hosts beside the daemon's (--local "
            "says so quietly; leave the flag out to use the daemon)")
        return config, None
    theirs = client.status().workspace
    if not theirs:
        return config, client  # a daemon older than status.workspace
    if kept is not None and Path(theirs) != kept:
        client.close()
        say(f"the daemon works on {theirs}: session {name} runs in this process instead")
        return config, None
    if kept is None and Path(theirs) != config.workspace:
        say(f"through the daemon: session {name} works on its workspace, {theirs}")
    return config, client
