"""Session KV-state files on disk: their names, loopd's metadata beside them, their space.

llama-server writes a slot's KV state into its ``--slot-save-path`` under a file name loopd
gives it (docs/llama-server.md#saving-and-restoring-a-slot). loopd names a session's file
``KEY.bin`` with ``KEY = NAME-HASH``, the hash taken of the session's log path, so two log
directories holding a session of the same name never share a file. Beside it loopd keeps
``KEY.json`` (:class:`SlotFile`): the session, the token count, the fingerprint of the
server that saved it (model identity, per-slot ``n_ctx``, slot count, server build), when it
was saved and last used, its size and crc32. A state is restored on a server of the same
model, slot count and build whatever its context size, as long as the context holds the
state's tokens: that is what llama-server itself takes (a larger context, or a smaller one
the state fits in).

Two kinds of save directory:

- **reachable** (the embedded server's, or ``slots.save_dir`` for a server on this
  machine): the server saves to ``KEY.new.bin``, loopd renames it over ``KEY.bin`` (so a
  file is replaced atomically, never half-written under its real name), records size and
  crc32, checks both before every restore, and keeps the total under ``slots.disk_mb``
  (least recently used first). Deleting a session deletes its file.
- **unreachable** (a server elsewhere): the server writes ``KEY.bin`` itself; loopd keeps
  the metadata in its own directory and cannot check, bound or delete the file.

The pure parts (:func:`restore_problem`, :func:`lru_victims`) decide; :class:`SlotStore`
does the file work.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import math
import os
import re
import stat
import time
import zlib
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from actors.base.config import Config, EmbeddedConfig
from actors.base.durable import named, write_all

__all__ = [
    "CORRUPT",
    "MISSING",
    "NO_STATE",
    "STALE",
    "TOO_LARGE_FOR_CONTEXT",
    "SlotFile",
    "SlotStore",
    "copy_state",
    "lru_victims",
    "meta_dir",
    "parse_meta",
    "remove_session_files",
    "restore_problem",
    "same_server",
    "slot_dir",
    "slot_dirs",
    "slot_key",
]

NO_STATE = "no saved state"
STALE = "the saved state is from another model or server build"
TOO_LARGE_FOR_CONTEXT = ("the saved state ({tokens:,} tokens) does not fit the server's "
                         "context ({n_ctx:,} tokens a slot)")
MISSING = "the saved state's file is gone"
CORRUPT = "the saved state's file is corrupt (its size or checksum changed since the save)"

_CHUNK = 8 * 1024 * 1024


def slot_key(log_path: Path) -> str:
    """``NAME-HASH`` for the session whose log is ``log_path`` (``log.dir/NAME/log.bin``)."""
    path = Path(log_path).expanduser().resolve()
    digest = hashlib.sha256(str(path).encode()).hexdigest()[:12]
    return f"{path.parent.name}-{digest}"


@dataclasses.dataclass(frozen=True, slots=True)
class SlotFile:
    """loopd's metadata of one saved session state (``KEY.json``)."""

    session: str  # the session's name
    file: str  # the state's file name in the server's save directory
    tokens: int  # tokens the state holds (the server's n_saved)
    fingerprint: str  # of the server that saved it: a file is restored only on an equal one
    server: str  # the URL that saved it
    saved: float  # unix time of the save
    used: float  # unix time of the last save or restore (least recently used goes first)
    bytes: int  # the file's size
    crc32: int = -1  # of the file; -1 when loopd cannot read it
    origin: str = ""  # the session whose state this is a copy of (a fork's source), until
    # the session saves its own


_CONTEXT = re.compile(r";n_ctx=\d*")


def same_server(saved: str, fingerprint: str) -> bool:
    """Whether a state saved by a server with fingerprint ``saved`` is for one with
    ``fingerprint``: the same model, slot count and build; the context size does not
    count."""
    return _CONTEXT.sub("", saved) == _CONTEXT.sub("", fingerprint)


def restore_problem(meta: SlotFile | None, fingerprint: str, size_crc: tuple[int, int] | None,
                    reachable: bool, n_ctx: int = 0) -> str:
    """Why ``meta``'s file must not be restored on a server with ``fingerprint`` and a
    per-slot context of ``n_ctx`` tokens (0: not known); "" if it may.

    ``size_crc`` is the file's size and crc32 as found now (None: no file), looked at only
    when the directory is ``reachable``.
    """
    if meta is None:
        return NO_STATE
    if not same_server(meta.fingerprint, fingerprint):
        return STALE
    if n_ctx and meta.tokens > n_ctx:
        return TOO_LARGE_FOR_CONTEXT.format(tokens=meta.tokens, n_ctx=n_ctx)
    if not reachable:
        return ""
    if size_crc is None:
        return MISSING
    if size_crc != (meta.bytes, meta.crc32):
        return CORRUPT
    return ""


def lru_victims(files: Iterable[SlotFile], limit_bytes: int) -> list[SlotFile]:
    """The files to delete, least recently used first, so that the rest fit ``limit_bytes``."""
    ordered = sorted(files, key=lambda f: (f.used, f.file))
    total = sum(f.bytes for f in ordered)
    victims = []
    for f in ordered:
        if total <= limit_bytes:
            break
        victims.append(f)
        total -= f.bytes
    return victims


_META_MAX = 64 * 1024  # a metadata file is a few hundred bytes
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_INTS = {"tokens": 0, "bytes": 0, "crc32": -1}  # and their smallest values
_FLOATS = ("saved", "used")
_STRS = ("session", "file", "fingerprint", "server")
_ORIGIN_MAX = 128  # a session name's longest
log = logging.getLogger("loopd.slots")
_said: set[str] = set()


def parse_meta(data: object, key: str) -> SlotFile | str:
    """The metadata of ``key``'s file from its decoded JSON, or why it cannot be used: each
    field of its type and range (a ``"used": "yesterday"`` or a negative ``bytes`` would
    break the LRU order or turn the disk bound off), naming the file loopd gave it."""
    if not isinstance(data, dict):
        return "it is not a JSON object"
    fields: dict[str, object] = {}
    for name in _STRS:
        value = data.get(name)
        if not isinstance(value, str):
            return f"{name} is not a string"
        fields[name] = value
    for name, low in _INTS.items():
        value = data.get(name, -1 if name == "crc32" else None)
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value < 2**63:
            return f"{name} is not a whole number of at least {low}"
        fields[name] = value
    if fields["crc32"] >= 2**32:  # type: ignore[operator]
        return "crc32 is not a crc32"
    origin = data.get("origin", "")
    if not isinstance(origin, str) or len(origin) > _ORIGIN_MAX:
        return f"origin is not a session name of at most {_ORIGIN_MAX} characters"
    fields["origin"] = origin
    for name in _FLOATS:
        value = data.get(name)
        if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(
                value) or value < 0:
            return f"{name} is not a time"
        fields[name] = float(value)
    if fields["file"] != SlotStore.file_name(key):
        return f"it names another file ({fields['file']!r:.80})"
    return SlotFile(**fields)  # type: ignore[arg-type]


@contextlib.contextmanager
def _regular(path: Path) -> Iterator[int | None]:
    """A descriptor of the regular file at ``path`` opened for reading, no symlink followed;
    None when it is not there, not a regular file, or cannot be opened."""
    try:
        fd = os.open(path, _READ)
    except OSError:
        fd = None
    if fd is None:
        yield None
        return
    try:
        yield fd if stat.S_ISREG(os.fstat(fd).st_mode) else None
    finally:
        os.close(fd)


def _read_regular(path: Path, limit: int) -> bytes | None:
    """At most ``limit`` + 1 bytes of the regular file at ``path``, no symlink followed;
    None when it is not there, not a regular file, or unreadable."""
    try:
        with _regular(path) as fd:
            return None if fd is None else os.read(fd, limit + 1)
    except OSError:
        return None


def _make_private(path: Path) -> None:
    """Mode 0600 for a state file (the server wrote it with its own umask); one of another
    user's server, or no longer a regular file, is left as it is."""
    with contextlib.suppress(OSError), _regular(path) as fd:
        if fd is not None:
            os.fchmod(fd, 0o600)


class SlotStore:
    """The files of one save directory (``save_dir``, reachable) or only their metadata."""

    def __init__(self, meta_dir: Path, *, reachable: bool) -> None:
        self.dir = Path(meta_dir).expanduser()
        self.reachable = reachable

    # --- names -------------------------------------------------------------------------

    @staticmethod
    def file_name(key: str) -> str:
        return f"{key}.bin"

    def save_name(self, key: str, tag: str = "") -> str:
        """The name the server saves to: a temporary one when loopd can rename it (``tag``
        in it when several processes may save ``key`` at once: a baseline)."""
        if not self.reachable:
            return self.file_name(key)
        return f"{key}.{tag}.new.bin" if tag else f"{key}.new.bin"

    def _meta_path(self, key: str) -> Path:
        return self.dir / f"{key}.json"

    # --- metadata ----------------------------------------------------------------------

    def meta(self, key: str) -> SlotFile | None:
        """The metadata of ``key``'s file; None when there is none, or when it cannot be
        used (logged once with the reason: it is skipped, never trusted)."""
        path = self._meta_path(key)
        raw = _read_regular(path, _META_MAX)
        if raw is None:
            if path.is_symlink() or (path.exists() and not path.is_file()):
                self._skip(path, "it is not a regular file")
            return None
        if len(raw) > _META_MAX:
            self._skip(path, f"it is over {_META_MAX // 1024} KiB")
            return None
        try:
            found = parse_meta(json.loads(raw.decode("utf-8")), key)
        except (ValueError, RecursionError) as e:
            found = f"it is not JSON ({e})"
        if isinstance(found, str):
            self._skip(path, found)
            return None
        return found

    @staticmethod
    def _skip(path: Path, why: str) -> None:
        said = f"{path}: {why}"
        if said not in _said:
            _said.add(said)
            log.warning("KV state metadata %s; skipped (the session re-processes instead)", said)

    def _write_meta(self, key: str, meta: SlotFile) -> None:
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        target = self._meta_path(key)
        tmp = target.with_name(target.name + ".tmp")
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()  # a crash's leftover, or something put there: never written through
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(json.dumps(dataclasses.asdict(meta)))
            os.replace(tmp, target)
        except OSError as e:  # a full disk: the older metadata stays, the half one goes
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise named(e, target) from None

    def touch(self, key: str, meta: SlotFile) -> None:
        """Mark ``key``'s file used now (it was restored)."""
        with contextlib.suppress(OSError):
            self._write_meta(key, dataclasses.replace(meta, used=time.time()))

    def size_crc(self, key: str, limit: int | None = None) -> tuple[int, int] | None:
        """The size and crc32 of ``key``'s file as it is now, reading at most ``limit`` + 1
        bytes (the recorded size: a file that grew is found changed without reading it
        all); None when it is gone, or not a regular file (a symlink is not followed:
        one to /dev/zero would never end)."""
        crc, size = 0, 0
        try:
            fd = os.open(self.dir / self.file_name(key), _READ)
        except OSError:
            return None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            left = math.inf if limit is None else limit + 1
            while left > 0 and (chunk := os.read(fd, int(min(_CHUNK, left)))):
                crc = zlib.crc32(chunk, crc)
                size += len(chunk)
                left -= len(chunk)
        except OSError:
            return None
        finally:
            os.close(fd)
        return size, crc

    # --- after a save ------------------------------------------------------------------

    def commit(self, key: str, meta: SlotFile, tag: str = "") -> SlotFile:
        """Put the file the server just saved (as ``save_name(key, tag)``) in place and
        write its metadata."""
        if self.reachable:
            os.replace(self.dir / self.save_name(key, tag), self.dir / self.file_name(key))
            _make_private(self.dir / self.file_name(key))
            found = self.size_crc(key)
            if found is not None:
                meta = dataclasses.replace(meta, bytes=found[0], crc32=found[1])
        self._write_meta(key, meta)
        return meta

    def copy(self, key: str, new_key: str, session: str) -> SlotFile | None:
        """Give ``new_key`` (session ``session``) a copy of ``key``'s state, for a fork: the
        file hard-linked (a copy where it cannot be) under a temporary name and renamed into
        place, then the metadata, which names ``key``'s session as the origin. The metadata
        is copied even when the file is gone or changed: the fork's first restore then says
        why it cannot be used, as it would have for ``key``. None when ``key`` has no saved
        state here (nothing to copy)."""
        meta = self.meta(key)
        if meta is None:
            return None
        if self.reachable:
            source, target = self.dir / self.file_name(key), self.dir / self.file_name(new_key)
            tmp = self.dir / f"{new_key}.fork.bin"
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
            if _link_or_copy(source, tmp, meta.bytes):
                os.replace(tmp, target)
        copied = dataclasses.replace(meta, session=session, file=self.file_name(new_key),
                                     used=time.time(), origin=meta.session)
        self._write_meta(new_key, copied)
        return copied

    def discard_save(self, key: str, tag: str = "") -> None:
        """Drop what the server saved (an empty slot: the older file stays the session's)."""
        if self.reachable:
            with contextlib.suppress(OSError):
                (self.dir / self.save_name(key, tag)).unlink()

    def all(self) -> list[tuple[str, SlotFile]]:
        out = []
        for path in sorted(self.dir.glob("*.json")):
            meta = self.meta(path.stem)
            if meta is not None:
                out.append((path.stem, meta))
        return out

    def bound(self, limit_bytes: int) -> list[str]:
        """Delete least recently used files until the directory fits; their keys."""
        if not self.reachable:
            return []  # loopd cannot see nor delete files it cannot reach
        files = self.all()
        by_file = {meta.file: key for key, meta in files}
        victims = lru_victims((m for _, m in files), limit_bytes)
        keys = [by_file[v.file] for v in victims]
        for key in keys:
            self.remove(key)
        return keys

    def remove(self, key: str) -> None:
        """Delete ``key``'s file (when reachable) and its metadata."""
        names = [f"{key}.json"]
        if self.reachable:
            names += [self.file_name(key), self.save_name(key)]
        for name in names:
            with contextlib.suppress(FileNotFoundError):
                (self.dir / name).unlink()


def _link_or_copy(source: Path, target: Path, limit: int) -> bool:
    """``source`` (a regular file, no symlink followed) at ``target``: a hard link, or a copy
    of at most ``limit`` + 1 bytes where a link cannot be made. False when there is no
    such file to copy."""
    try:
        if not stat.S_ISREG(os.lstat(source).st_mode):
            return False
        os.link(source, target, follow_symlinks=False)
        return True
    except FileNotFoundError:
        return False
    except OSError:
        pass  # another file system, or links refused: copy it
    with _regular(source) as fd:
        if fd is None:
            return False
        out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                      0o600)
        try:
            left = limit + 1
            while left > 0 and (chunk := os.read(fd, min(_CHUNK, left))):
                write_all(out, chunk)
                left -= len(chunk)
        finally:
            os.close(out)
    return True


def copy_state(stores: Sequence[SlotStore], src_log: Path, new_log: Path) -> SlotFile | None:
    """Give the session whose log will be ``new_log`` a copy of the saved KV state of the
    one at ``src_log`` (a fork), in every store that has one; the metadata of the first
    copy, None when there was none. A store loopd cannot reach gets no copy (the server
    holds its files): a fork there re-processes its first request."""
    key, new_key = slot_key(src_log), slot_key(new_log)
    found = None
    for store in stores:
        if store.reachable:
            copied = store.copy(key, new_key, Path(new_log).parent.name)
            found = found or copied
    return found


def slot_dir(embedded: EmbeddedConfig) -> Path:
    """The embedded server's ``--slot-save-path``: the sessions' KV state files
    (docs/slots.md#files). Here, not in the server's module: every world asks it (its
    :func:`meta_dir`), and one on a url needs none of the embedded server's imports."""
    return embedded.data_path / "slots"


def meta_dir(config: Config) -> Path:
    """Where loopd keeps the metadata of files on servers whose save directory it cannot
    reach (``slots.save_dir`` unset for a server named by url)."""
    return slot_dir(config.embedded) / "meta"


def slot_dirs(config: Config) -> list[SlotStore]:
    """Every store a session of ``config`` may have files in (see ``actors.session.world``)."""
    stores = [SlotStore(slot_dir(config.embedded), reachable=True),
              SlotStore(meta_dir(config), reachable=False)]
    if config.slots.save_dir:
        stores.append(SlotStore(Path(config.slots.save_dir), reachable=True))
    return stores


def remove_session_files(stores: Sequence[SlotStore], log_path: Path) -> None:
    """Delete the saved KV state of the session whose log is ``log_path``, everywhere."""
    key = slot_key(log_path)
    for store in stores:
        store.remove(key)
