"""The command's tests' world: a workspace with a note, and a config file that points the
sessions, the tools and the daemon's runtime directory into the test's own folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def cli_env(tmp_path: Path, *, standard: bool = True) -> dict[str, Any]:
    """``config`` (the file's path), ``dir`` (the sessions), ``workspace``, ``tmp``.

    ``standard``: the standard tool hosts (files, shell, web: three processes), as a person
    has them; else one host with the file tools, for tests that need no other tool (each
    world then starts one host process instead of three)."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "notes.txt").write_text("Buy seeds.\n")
    config = tmp_path / "loopd.toml"
    hosts = "" if standard else (
        'standard = false\n[[tools.hosts]]\nname = "files"\n'
        'tools = ["read_file", "list_dir", "search_files", "write_file"]\n'
    )
    config.write_text(  # [inference] last: tests add keys to it
        f'[log]\ndir = "{tmp_path / "sessions"}"\nfsync = "never"\n'
        f'[tools]\nworkspace = "{workspace}"\ntimeout_s = 10\nstart_timeout_s = 120\n{hosts}'
        f'[daemon]\nruntime_dir = "{tmp_path / "run"}"\n'
        "[inference]\nretries = 1\nbackoff_s = 0.01\ntimeout_s = 20\n"
    )
    return {"config": str(config), "dir": tmp_path / "sessions", "workspace": workspace,
            "tmp": tmp_path}  # fmt: skip
