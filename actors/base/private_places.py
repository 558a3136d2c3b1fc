"""Where loopd keeps its own things, and which of them the tools must never reach.

A sandboxed command (``run_command``) and the file tools work in the workspace; loopd's own
files are not theirs. :func:`private_places` names them, so the tool hosts can hide them
(the sandbox mounts an empty directory, or an empty file, over each; the file tools refuse
a path into one): the daemon's runtime directory (its socket and pid file, wherever
``daemon.runtime_dir`` puts it) and an ipc ``daemon.endpoint``'s directory, the temporary
directory where every loopd's tool hosts have their sockets, the sessions' logs, the
embedded model's data (models, KV state), ``slots.save_dir``, the rules file, the config
files this process read (an ``inference.api_key`` may be in one) and the CURVE key files.
A command that reached the daemon's socket could start a turn and answer its own approval
"always"; one that read the logs would see other sessions' conversations.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from actors.base.config import Config, files_read

__all__ = ["private_places", "runtime_dir"]


def runtime_dir(config: Config) -> Path:
    """``daemon.runtime_dir``, else ``$XDG_RUNTIME_DIR/loopd``, else ``/tmp/loopd-UID``."""
    if config.daemon.runtime_dir:
        return Path(config.daemon.runtime_dir).expanduser()
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and Path(xdg).is_dir():
        return Path(xdg) / "loopd"
    return Path(tempfile.gettempdir() if len(tempfile.gettempdir()) < 40 else "/tmp") / (
        f"loopd-{os.getuid()}"
    )


def private_places(config: Config) -> tuple[str, ...]:
    """The absolute paths of loopd's own files and sockets (some may not exist yet)."""
    d = config.daemon
    places = [runtime_dir(config), Path(tempfile.gettempdir()), config.log_dir,
              config.embedded.data_path, config.rules_path]
    if d.endpoint.startswith("ipc://"):
        places.append(Path(d.endpoint.removeprefix("ipc://")).parent)
    if config.slots.save_dir:
        places.append(Path(config.slots.save_dir).expanduser())
    keys = [d.curve_secret, d.allow_keys, d.client_key,
            *(h.client_key for h in config.tools.hosts)]
    places += [Path(k).expanduser() for k in keys if k]
    places += [Path(f) for f in files_read()]  # an inference.api_key may be in one
    return tuple(dict.fromkeys(os.path.abspath(p) for p in places))
