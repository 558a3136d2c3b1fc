"""The command's tests' world: a workspace with a note, and a config file that points the
sessions, the tools and the daemon's runtime directory into the test's own folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def cli_env(tmp_path: Path) -> dict[str, Any]:
    """``config`` (the file's path), ``dir`` (the sessions), ``workspace``, ``tmp``."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "notes.txt").write_text("Buy seeds.\n")
    config = tmp_path / "loopd.toml"
    config.write_text(
        f'[log]\ndir = "{tmp_path / "sessions"}"\nfsync = "never"\n'
        f'[tools]\nworkspace = "{workspace}"\ntimeout_s = 10\nstart_timeout_s = 120\n'
        f'[daemon]\nruntime_dir = "{tmp_path / "run"}"\n'
        "[inference]\nretries = 1\nbackoff_s = 0.01\ntimeout_s = 20\n"
    )
    return {"config": str(config), "dir": tmp_path / "sessions", "workspace": workspace,
            "tmp": tmp_path}  # fmt: skip
