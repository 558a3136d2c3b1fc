"""Fork and rewind (docs/rendering.md#fork-and-rewind): a branch costs nothing, an undo
loses nothing.

**Fork**: :func:`fork_session` makes session NEW from session SRC's log: SRC's bytes up to
the end of turn ``at`` (all of them by default), copied as they are, then a
:class:`~actors.log.records.Forked` note (it renders to nothing). So NEW's rendering is a
prefix of what SRC sent (or of SRC's last request and its answer), and SRC's saved KV state
serves it: the state file is copied too (hard-linked where it can be,
:func:`~actors.inference.slots.files.copy_state`), and the server keeps the common prefix
of the restored state and NEW's first prompt and drops the rest. The note goes at the end
rather than after the Baseline so that the copied bytes stay SRC's and a Compaction's
``kept`` (an index) still points at the same record.

- SRC is only read, never locked nor written: a fork taken while SRC runs a turn copies
  the whole records written so far (a record being appended is not whole yet).
- NEW is absent or whole: its directory is built under a hidden name and renamed into
  place. A fork killed before that leaves a hidden directory the next fork removes, with
  the KV state it had copied for NEW; the state is copied before the rename, so a NEW that
  exists has its state.
- Forks are one at a time (a lock file in ``log.dir``), across processes.
- Turn N is the N-th User record of the log. ``at`` must be a turn NEW will show (a turn
  that was rewound before turn N+1 was asked cannot be forked at: the fork would show
  less than it says).

**Rewind**: :func:`rewind_target` says which ``to_turn`` undoes the last ``turns`` turns
still in the conversation; the session actor appends the
:class:`~actors.log.records.Rewind` (:meth:`actors.session.actor.SessionActor.rewind`). A
rewind past a compaction is allowed: the fold puts the summary back as it was then
(actors/session/messages.py), and the first request after it re-processes that older
epoch (its state is not kept), a ``CacheLoss`` that says so.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

from actors.base.config import Config
from actors.base.durable import fsync_dir, locked, write_all
from actors.base.errors import SessionError, UsageError
from actors.inference.slots.files import SlotFile, copy_state, remove_session_files, slot_dirs
from actors.log.file import frame, read_frames
from actors.log.records import Forked, Record, Rewind, User
from actors.log.sessiondir import (
    FORK_LOCK,
    WORKSPACE,
    check_name,
    fork_leftovers,
    fork_tmp,
    session_path,
)
from actors.session import traced
from actors.session.messages import view

__all__ = ["ForkReport", "RewindReport", "fork_session", "rewind_target"]



@dataclasses.dataclass(frozen=True, slots=True)
class ForkReport:
    """What a fork made: its note, the records copied, the KV state copied (None: none)."""

    forked: Forked
    records: int
    state: SlotFile | None


@traced.fork
def fork_session(
    config: Config, src: str, new: str, at: int | None = None, *,
    save: Callable[[str], None] | None = None,
) -> ForkReport:  # fmt: skip
    """Make session ``new`` from ``src``'s records up to the end of turn ``at`` (all by
    default) and a copy of its saved KV state. ``save(src)``, when given, brings that
    state up to date first (the slot keeper of the process that runs ``src``).

    UsageError: a bad name, ``new`` taken, ``at`` not a turn to fork at; SessionError:
    ``src`` missing or unreadable.
    """
    source, target = session_path(config, src), session_path(config, check_name(new))
    if src == new:
        raise UsageError(f"a fork needs a new name: session {src} exists")
    root = config.log_dir
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    with locked(root / FORK_LOCK):
        _sweep(config)
        if target.parent.exists() or target.parent.is_symlink():
            raise UsageError(f"session {new} exists ({target.parent}); fork into a new name")
        if not source.is_file():
            raise SessionError(f"session {src} does not exist ({source})")
        if save is not None:
            save(src)
        data, records, ends = read_frames(source, name=src)
        count = _cut(src, records, at)
        taken = sum(1 for r in records[:count] if isinstance(r, User))
        forked = Forked(from_=src, at=taken)
        tmp = fork_tmp(config, new)
        try:
            tmp.mkdir(mode=0o700)  # first: a fork killed after it leaves a name to sweep
            state = copy_state(slot_dirs(config), source, target)
            _write_session(tmp, data[: ends[count - 1]] + frame(forked),
                           source.parent / WORKSPACE)
            os.rename(tmp, target.parent)  # a directory made since is not empty: refused
        except OSError as e:
            shutil.rmtree(tmp, ignore_errors=True)
            if target.parent.exists():  # made since the check, not by a fork (they wait)
                raise UsageError(f"session {new} exists ({target.parent}); fork into a new "
                                 "name") from None
            remove_session_files(slot_dirs(config), target)
            raise SessionError(f"session {new}: the fork could not be written in {root}: "
                               f"{e.strerror or e}") from None
        fsync_dir(root)
    return ForkReport(forked, count, state)


def _cut(src: str, records: Sequence[Record], at: int | None) -> int:
    """How many of ``src``'s records a fork at turn ``at`` copies."""
    starts = [i for i, r in enumerate(records) if isinstance(r, User)]
    if at is None:
        return len(records)
    if not 0 <= at <= len(starts):
        raise UsageError(f"session {src} has turns 1 to {len(starts)}: --at must be one of "
                         "them (or 0: only its start)" if starts else
                         f"session {src} has no turns yet: fork it at 0 or at its end")
    count = starts[at] if at < len(starts) else len(records)
    shown = view(records[:count]).turns
    if at and at not in shown:
        raise UsageError(f"turn {at} of session {src} was rewound before turn {at + 1} was "
                         f"asked; fork at a turn it shows then: "
                         f"{', '.join(map(str, shown)) or 'none'} (or 0)")
    return count


@dataclasses.dataclass(frozen=True, slots=True)
class RewindReport:
    """What a rewind did: its record, the turns it took back, the turns left shown."""

    rewind: Rewind
    taken: tuple[int, ...]
    left: tuple[int, ...]


def rewind_target(name: str, records: Sequence[Record], turns: int) -> RewindReport:
    """The Rewind that takes back the last ``turns`` turns still in the conversation (not
    appended: the session actor does that); UsageError when there are not that many."""
    shown = view(records).turns
    if turns < 1:
        raise UsageError(f"rewind takes back 1 turn or more, not {turns}")
    if turns > len(shown):
        have = f"only {len(shown)} turn{'s' if len(shown) != 1 else ''}" if shown else "no turns"
        raise UsageError(f"session {name} has {have} to take back, not {turns}")
    to_turn = shown[-turns - 1] if turns < len(shown) else 0
    return RewindReport(Rewind(to_turn=to_turn), shown[-turns:], shown[:-turns])


def _write_session(tmp: Path, log: bytes, workspace: Path) -> None:
    """The session directory ``tmp``'s log (synced) and the source's workspace file."""
    fd = os.open(tmp / "log.bin", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        write_all(fd, log)
        os.fsync(fd)
    finally:
        os.close(fd)
    with contextlib.suppress(FileNotFoundError):
        shutil.copyfile(workspace, tmp / WORKSPACE, follow_symlinks=False)
    fsync_dir(tmp)


def _sweep(config: Config) -> None:
    """Remove what forks killed half-way left (forks are one at a time: none runs now): the
    hidden directory, and the KV state copied for a session that was then never made (a
    session made later under that name must not start from a state that is not its own)."""
    for leftover, name in fork_leftovers(config):
        with contextlib.suppress(UsageError):  # a name no fork made: only the directory
            target = session_path(config, name)
            if not target.parent.exists():
                remove_session_files(slot_dirs(config), target)
        shutil.rmtree(leftover, ignore_errors=True)
