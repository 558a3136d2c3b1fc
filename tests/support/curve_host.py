"""A CURVE tool host for the tests: it lets in the client key ``friend`` only.

``curve_host()`` runs a real host on tcp://127.0.0.1 (a free port) with a fresh key pair
for itself and for two clients, ``friend`` (in its allow directory) and ``stranger``.
"""

from __future__ import annotations

import contextlib
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

from actors.tools.protocol import wire
from actors.wire.curve import load_secret, write_keypair
from tests.tools.hostkit import FAKE, short_dir, spawn_host, wait_until

__all__ = ["Remote", "curve_host", "curve_options", "server_keys", "touch"]


class Remote(NamedTuple):
    endpoint: str
    server_key: bytes
    dir: Path
    keys: Path
    allowed: Path


def server_keys(d: Path, server: str = "server") -> tuple[Path, Path, Path]:
    """Key pairs under ``d/keys`` for a CURVE server and two clients, ``friend`` (in the
    allow directory ``d/allowed``) and ``stranger``: (keys, allowed, the server's secret)."""
    keys, allowed = d / "keys", d / "allowed"
    allowed.mkdir(parents=True)
    _, server_secret = write_keypair(keys, server)
    friend_public, _ = write_keypair(keys, "friend")
    write_keypair(keys, "stranger")
    shutil.copy(friend_public, allowed)
    return keys, allowed, server_secret


@contextlib.contextmanager
def curve_host() -> Iterator[Remote]:
    """The host, up and bound; stopped when the block ends."""
    with short_dir() as d:
        keys, allowed, server_secret = server_keys(d)
        log = d / "host.log"
        args = ("--provider", FAKE, "--curve-secret", str(server_secret),
                "--allow-keys", str(allowed))  # fmt: skip
        with spawn_host("tcp://127.0.0.1:*", *args, log=log):
            wait_until(
                lambda: log.exists() and "serving" in log.read_text(), 60, "the host to bind"
            )
            endpoint = re.findall(r"serving .* on (tcp://\S+)", log.read_text())[0]
            yield Remote(endpoint, load_secret(server_secret)[0], d, keys, allowed)


def curve_options(remote: Remote, name: str) -> dict[str, Any]:
    """Socket options of a client holding the key pair ``name``."""
    public, secret = load_secret(remote.keys / f"{name}.key_secret")
    return {
        "curve_serverkey": remote.server_key,
        "curve_publickey": public,
        "curve_secretkey": secret,
    }


def touch(remote: Remote, name: str, id: int = 1) -> wire.ToolRequest:
    """A request that makes the fake host create the file ``name`` in the host's folder."""
    return wire.ToolRequest(id, "s", 1, "touch", {"path": str(remote.dir / name)})
