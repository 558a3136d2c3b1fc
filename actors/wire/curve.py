"""CURVE keys: ``loopd keys``, the loaders both ends use, and the server side's allow-list.

A key pair is two files in pyzmq's certificate format (so ``zmq.auth`` reads them):
``NAME.key`` (the public key: give it to the other side) and ``NAME.key_secret`` (both
keys: keep it). The secret file is created with mode 0600 from the start, never chmod-ed
afterwards, and a secret file that others can read is refused when loaded, the way ssh
refuses a loose private key.

- The **host** gets ``--curve-secret host.key_secret`` and ``--allow-keys DIR``, a
  directory holding the ``.key`` files of the clients it lets in.
- The **daemon** names the host's public key (``server_key``: the 40-character Z85 text or
  the ``.key`` file) and its own secret file (``client_key``) in ``[[tools.hosts]]``.
- The daemon's own client socket on ``tcp://`` is a CURVE server the same way
  (``daemon.curve_secret``, ``daemon.allow_keys``), and its clients name its public key.

:func:`curve_server` makes a ROUTER a CURVE server whose clients are the ``.key`` files of a
directory (ZAP through ``zmq.auth``): an unknown key is refused in the handshake, so it gets
no answer at all. At every handshake the directory is looked at (the ``.key`` files' names,
sizes and times: one listing) and read again when it changed, so adding a client's ``.key``
file needs no restart and a deleted one is refused from its next connection (a connection
already open stays: ZAP checks handshakes).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import logging
import os
import stat
import sys
from pathlib import Path
from typing import Any

import zmq
import zmq.auth
import zmq.utils.z85

from actors.base.errors import KeyFileError, UsageError
from actors.wire.complaints import Complaints

__all__ = ["KeyDirectory", "curve_server", "load_public", "load_secret", "main", "write_keypair"]

log = logging.getLogger("loopd.keys")


_BANNER = (
    "#   ****  Generated on {when} by loopd keys  ****\n#   ZeroMQ CURVE {what} Certificate\n\n"
)


def _cert(what: str, public: bytes, secret: bytes | None) -> str:
    text = _BANNER.format(when=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), what=what)
    text += f'metadata\ncurve\n    public-key = "{public.decode()}"\n'
    if secret is not None:
        text += f'    secret-key = "{secret.decode()}"\n'
    return text


def write_keypair(directory: Path, name: str, *, force: bool = False) -> tuple[Path, Path]:
    """Write ``name.key`` and ``name.key_secret`` (0600) in ``directory``; return both paths."""
    directory.mkdir(parents=True, exist_ok=True)
    public_file, secret_file = directory / f"{name}.key", directory / f"{name}.key_secret"
    if not force:
        for f in (public_file, secret_file):
            if f.exists():
                raise KeyFileError(f"{f} already exists; pick another name or pass --force")
    public, secret = zmq.curve_keypair()
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
    if force and secret_file.exists():
        secret_file.unlink()
    fd = os.open(secret_file, flags | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(_cert("**Secret**", public, secret))
    os.chmod(secret_file, 0o600)  # in case a umask or filesystem widened it
    public_file.write_text(_cert("Public", public, None), encoding="utf-8")
    return public_file, secret_file


def load_secret(path: str | os.PathLike[str]) -> tuple[bytes, bytes]:
    """(public, secret) from a ``.key_secret`` file; refuses files others can read."""
    p = Path(path).expanduser()
    try:
        mode = p.stat().st_mode
    except OSError as e:
        raise KeyFileError(
            f"secret key file {p}: {e.strerror}; make one with `loopd keys NAME`"
        ) from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise KeyFileError(
            f"secret key file {p} can be read by others (mode {stat.S_IMODE(mode):o}); "
            f"run: chmod 600 {p}"
        )
    try:
        public, secret = zmq.auth.load_certificate(p)
    except (OSError, ValueError) as e:
        raise KeyFileError(f"{p} is not a key file made by `loopd keys`: {e}") from None
    if not secret or not public:
        raise KeyFileError(f"{p} holds no secret key; give the .key_secret file, not the .key file")
    return public, secret


def load_public(text_or_path: str) -> bytes:
    """A public key from its 40-character Z85 text or from a ``.key`` file."""
    text = text_or_path.strip()
    if len(text) == 40 and not os.path.exists(text):
        try:
            zmq.utils.z85.decode(text)
        except (ValueError, KeyError):
            raise KeyFileError(f"{text!r} is not a 40-character Z85 public key") from None
        return text.encode("ascii")
    p = Path(text).expanduser()
    try:
        public, _ = zmq.auth.load_certificate(p)
    except (OSError, ValueError) as e:
        raise KeyFileError(
            f"{text!r} is neither a 40-character Z85 public key nor a readable .key file: {e}"
        ) from None
    return public


class KeyDirectory:
    """ZAP credentials callback: lets in a client whose public key has a .key file in ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.keys: set[bytes] = set()
        self.seen: tuple[tuple[str, int, int, int], ...] | None = None

        self._complain = Complaints(logger=log)
        self.reload()

    def _files(self) -> tuple[tuple[str, int, int, int], ...]:
        """The ``.key`` files as (name, inode, size, mtime): what changes when one does."""
        found = []
        with contextlib.suppress(OSError), os.scandir(self.path) as entries:
            for entry in entries:
                if entry.name.endswith(".key"):
                    with contextlib.suppress(OSError):
                        st = entry.stat()
                        found.append((entry.name, st.st_ino, st.st_size, st.st_mtime_ns))
        return tuple(sorted(found))

    def reload(self) -> None:
        files = self._files()
        keys = set()
        for name, *_ in files:
            try:
                public, _ = zmq.auth.load_certificate(self.path / name)
                keys.add(public)
            except (OSError, ValueError) as e:
                log.warning("allow-keys: skipping %s: %s", self.path / name, e)
        if not keys:
            log.warning("no client keys (*.key) in %s: no client can connect yet", self.path)
        self.keys, self.seen = keys, files

    def callback(self, domain: str, key: bytes) -> bool:
        if self._files() != self.seen:
            self.reload()
        if key in self.keys:
            return True
        self._complain(
            "refused a client with unknown key %s (not in %s)",
            key.decode(errors="replace"),
            self.path,
        )
        return False


def curve_server(
    ctx: zmq.Context[Any], sock: zmq.Socket[Any], secret_file: str, allow_dir: str
) -> Any:
    """Make ``sock`` (not yet bound) a CURVE server admitting the keys in ``allow_dir``.

    Returns the started ``ThreadAuthenticator``: the caller stops it after closing ``sock``.
    KeyFileError / UsageError for a bad key file or directory.
    """
    directory = Path(allow_dir).expanduser()
    if not directory.is_dir():
        raise UsageError(
            f"allowed client keys: {directory} is not a directory; put the clients' .key "
            "files in one"
        )
    public, secret = load_secret(secret_file)
    from zmq.auth.thread import ThreadAuthenticator

    auth = ThreadAuthenticator(ctx)
    auth.start()
    auth.configure_curve_callback(domain="*", credentials_provider=KeyDirectory(directory))
    sock.curve_secretkey = secret
    sock.curve_publickey = public
    sock.curve_server = True
    return auth


def main(argv: list[str]) -> int:
    """``loopd keys NAME [--dir DIR] [--force]``: make a key pair, print what to do with it."""
    parser = argparse.ArgumentParser(
        prog="loopd keys",
        description="Make a CURVE key pair for a remote tool host, or for a daemon that "
        "connects to one.",
    )
    parser.add_argument("name", help="file name stem, e.g. 'host' or 'laptop'")
    parser.add_argument(
        "--dir", default="~/.config/loopd/keys", help="where to write (default: %(default)s)"
    )
    parser.add_argument("--force", action="store_true", help="replace existing files")
    args = parser.parse_args(argv)
    if not args.name or "/" in args.name or args.name.startswith("."):
        print(
            f"loopd keys: bad name {args.name!r}: use a plain file name like 'host'",
            file=sys.stderr,
        )
        return 2
    try:
        public_file, secret_file = write_keypair(
            Path(args.dir).expanduser(), args.name, force=args.force
        )
    except (KeyFileError, OSError) as e:
        print(f"loopd keys: {e}", file=sys.stderr)
        return 2
    public, _ = zmq.auth.load_certificate(public_file)
    print(f"public key  {public.decode()}\n  written to {public_file}")
    print(f"secret key  written to {secret_file} (mode 600: keep it, never copy it elsewhere)")
    print(
        "For a tool host: run it with --curve-secret on the .key_secret file, and put the .key\n"
        "files of the clients it accepts in its --allow-keys directory.\n"
        "For the daemon: set client_key to the .key_secret file, and copy the .key file into the\n"
        "host's --allow-keys directory."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
