"""The slot keeper: which session's KV state sits in which slot of which server (docs/slots.md).

The KV cache belongs to the session, like its log. One keeper per process that runs
sessions owns the map session -> (server, slot). Every model request of a session takes a
**lease** on one slot and gives it back when the request ends (:mod:`actors.inference.actor`
does both around the stream), so:

- **Affinity**: a session gets back the slot that still holds its state whenever that slot
  is not leased, so between two requests nothing is lost or moved.
- **A lease per model request is a lease per turn, made safe**: a turn that waits for a tool
  or for the person's approval holds no slot, so another session can use it meanwhile, and
  no turn can deadlock holding one. A lease is always taken before an inference actor and
  nothing waits while holding both, so there is no cycle to deadlock on.
- **Eviction**: when no slot is free, the least recently used idle slot is given away; its
  session's state is **saved** first (when it changed since its last save).
- **Restore**: a session whose state is not in its slot has its file restored, if it has one
  valid for this server (:func:`~actors.inference.slots.files.restore_problem`); otherwise the
  request re-processes. Nothing here is trusted blindly: the request's ``timings.cache_n``
  says what was reused, and the turn logs a ``CacheLoss`` with the cause when it is short.
  Every failure is a reason on the lease (``SlotUse.reason``), never an error.
- **Queueing**: a request that finds no slot for it waits in arrival order (per server),
  through the handle's waiting loop (Queued, cancel, deadline).
- **Saves**: before a slot changes hands, after a turn (``slots.save_after_turn``, when the
  turn says it ended, :meth:`SlotKeeper.turn_ended`, in the keeper's saver thread, after
  the answer was shown; the slot is not leased again until its save is done), and for
  every changed state when the command ends (:meth:`SlotKeeper.close`).
- **Queued means others**: a request waits silently for its own session's save; the
  ``Queued`` event is for waiting behind other sessions and names them
  (:meth:`SlotKeeper.waiting_on`).
- **Several servers**: a session keeps its server; a new one goes to the server with the
  most free slots; a server that stops answering (connect errors after the usual retries)
  is dropped while another one is left, and its sessions move ("server changed").

The keeper is a thread-safe owner rather than an actor: its callers (session actors, the
saver thread) each block on their own lease anyway, and the HTTP work of saving and
restoring runs in the caller's thread, outside the lock. The pure decisions are
:func:`pick_server` and :func:`pick_slot` here and the file checks in
:mod:`actors.inference.slots.files`.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import itertools
import json
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from actors.base import telemetry
from actors.base.cancel import CancelToken
from actors.inference import traced
from actors.inference.llama import LlamaClient
from actors.inference.slots import baseline
from actors.inference.slots.files import (
    NO_STATE,
    SlotFile,
    SlotStore,
    restore_problem,
    slot_key,
)
from actors.inference.types import BaselineUse, Completion, InferError, InferErrorKind
from actors.log import server_values
from actors.log.records import SlotState, SlotUse
from actors.log.sessiondir import log_file

__all__ = [
    "KeeperSettings",
    "Lease",
    "Pick",
    "ServerSpec",
    "SlotKeeper",
    "Ticket",
    "pick_server",
    "pick_slot",
]

log = logging.getLogger("loopd.slots")

NO_SAVE_PATH = "the server has no --slot-save-path"
NO_PERSISTENCE = "the server's KV state is not kept ({why})"
REFUSED = "the server refused the saved state: {message}"
RESTORE_FAILED = "the restore failed: {message}"
SAVE_FAILED = "the last save failed: {message}"
TOO_LARGE = "its saved state was larger than slots.disk_mb and was deleted"
SERVER_CHANGED = "server changed: {url} did not answer"
FORKED = "the saved state of session {origin}, which this one was forked from"
BASE_RESTORED = "the baseline (system prompt and tools) saved for new sessions"
BASE_HELD = "the slot held the baseline (system prompt and tools)"
BASE_PROCESSED = ("the baseline (system prompt and tools) processed first: {tokens:,} tokens "
                  "in {ms:.0f} ms")
BASE_SAVED = "saved for new sessions"
BASE_NOT_SAVED = "not saved: {message}"
BASE_LOST = "the saved baseline could not be restored: {why}"
BASE_NOT_PROCESSED = "the baseline could not be processed first: {message}"
BASE_NO_TEMPLATE = "the baseline's prompt could not be rendered: {message}"
RESTORED_NOTHING = "the server restored no tokens"

_SAVE_WAIT_S = 60.0  # save_now: how long a save in flight is waited for (a hang guard)
_PREFIXES = 64  # rendered baselines remembered per server
_ENTRIES = 1024  # sessions remembered past their use (their server, what to tell them)
_PROBE = "loopd-probe"  # an action no server knows: 400 with a save path, 501 without


@dataclasses.dataclass(frozen=True, slots=True)
class ServerSpec:
    """One llama-server the keeper leases slots of."""

    url: str
    save_dir: Path | None = None  # its --slot-save-path, when loopd can reach it
    identity: str = ""  # model and build identity known to loopd; "": from /props


@dataclasses.dataclass(frozen=True, slots=True)
class KeeperSettings:
    """How the keeper keeps state: where metadata lives, how much disk, when it saves."""

    log_dir: Path | None = None  # sessions' log directory (their files' names hash it)
    meta_dir: Path | None = None  # metadata of unreachable servers; None: no persistence
    disk_bytes: int = 2048 * 1024 * 1024
    save_after_turn: bool = False
    warm_start: bool = False  # the baseline's state restored into a new session's slot


@dataclasses.dataclass(slots=True)
class _Slot:
    index: int
    holder: str | None = None  # the session whose state the slot holds
    dirty: bool = False  # the holder's state changed since its last save
    leased: bool = False
    lessee: str = ""  # the session whose request has the slot leased
    saving: bool = False
    used: int = 0  # logical time of its last lease (least recently used goes first)
    base: tuple[str, int] | None = None  # the baseline (key, tokens) its state starts with


@dataclasses.dataclass(slots=True)
class _Server:
    url: str
    client: LlamaClient
    slots: list[_Slot]
    fingerprint: str
    store: SlotStore | None  # None: no persistence on this server
    n_ctx: int = 0  # tokens of context per slot (/props); 0: unknown
    why_not: str = ""  # why there is no store
    alive: bool = True
    prefixes: dict[str, tuple[str, str]] = dataclasses.field(default_factory=dict)
    # the rendered baseline prefix and its key, by the baseline as sent (JSON)
    no_template: str = ""  # why it renders no baseline (no /apply-template): no warm starts


@dataclasses.dataclass(slots=True)
class _Session:
    name: str
    key: str
    home: int | None = None  # the server it keeps
    note: str = ""  # what its next restore should tell (a failed save, a server change)
    base: tuple[str, int] | None = None  # its baseline (key, tokens), once known


@dataclasses.dataclass(frozen=True, slots=True)
class Pick:
    """Which slot a session gets: its own (kept), a free one, or one taken from another."""

    slot: int
    kind: Literal["kept", "free", "evict"]
    evicted: str | None = None


def pick_slot(session: str, slots: Sequence[_Slot]) -> Pick | None:
    """The slot to lease ``session`` now on one server, or None: it must wait."""
    for s in slots:
        if s.holder == session:
            return None if s.leased or s.saving else Pick(s.index, "kept")
    idle = [s for s in slots if not s.leased and not s.saving]
    free = [s for s in idle if s.holder is None]
    if free:
        return Pick(min(free, key=lambda s: s.used).index, "free")
    if idle:
        lru = min(idle, key=lambda s: s.used)
        return Pick(lru.index, "evict", lru.holder)
    return None


def pick_server(home: int | None, servers: Sequence[tuple[bool, int, int]]) -> int:
    """The server for a session: its ``home`` while alive, else the alive one with most room.

    ``servers``: (alive, free slots, idle slots) each. At least one is alive (the keeper
    never drops the last server).
    """
    if home is not None and servers[home][0]:
        return home
    alive = [i for i, (ok, _, _) in enumerate(servers) if ok] or list(range(len(servers)))
    return max(alive, key=lambda i: (servers[i][1], servers[i][2], -i))


@dataclasses.dataclass(frozen=True, slots=True)
class _Grant:
    """A slot marked leased under the lock; what preparing it (outside the lock) needs."""

    session: _Session
    target: int  # the server's index
    pick: Pick
    save_first: bool  # the evicted session's changed state is saved before the restore
    note: str  # what the keeper noticed for the session, said on its SlotUse


@dataclasses.dataclass(frozen=True, slots=True)
class Ticket:
    """A request's place in the keeper's queue."""

    session: str
    number: int


@dataclasses.dataclass(frozen=True, slots=True)
class Lease:
    """One slot of one server, leased to a session for one request."""

    session: str
    server: int
    slot: int
    client: LlamaClient
    use: SlotUse
    baseline: BaselineUse | None = None  # what warm_start gave the slot


class SlotKeeper:
    """Owns the leases of every slot of every server; thread-safe."""

    def __init__(self, servers: Sequence[_Server], settings: KeeperSettings,
                 say: Callable[[str], None]) -> None:
        self._servers = list(servers)
        self._settings = settings
        self._say = say
        self._cond = threading.Condition()
        # by name, least recently leased first; and by key (a save names its key)
        self._sessions: dict[str, _Session] = {}
        self._keys: dict[str, _Session] = {}
        self._waiting: collections.OrderedDict[int, Ticket] = collections.OrderedDict()
        self._numbers = itertools.count(1)
        self._clock = itertools.count(1)
        self._saves: queue.SimpleQueue[tuple[int, int, str] | None] = queue.SimpleQueue()
        self._saver: threading.Thread | None = None
        self._closed = False
        self._base_locks: dict[str, threading.Lock] = {}  # one warm start per baseline at once

    @classmethod
    def start(cls, servers: Sequence[tuple[ServerSpec, LlamaClient]], settings: KeeperSettings,
              say: Callable[[str], None] = lambda _: None) -> SlotKeeper:
        """Read each server's ``/props`` and whether it can save; say what is not kept."""
        return cls([_probe(spec, client, settings, say) for spec, client in servers],
                   settings, say)

    # --- leases ------------------------------------------------------------------------

    def enter(self, session: str) -> Ticket:
        """Queue a request of ``session`` (every request does, even one served at once)."""
        with self._cond:
            ticket = Ticket(session, next(self._numbers))
            self._waiting[ticket.number] = ticket
            return ticket

    def leave(self, ticket: Ticket) -> None:
        with self._cond:
            if self._waiting.pop(ticket.number, None) is not None:
                self._cond.notify_all()

    def ahead(self, ticket: Ticket) -> int:
        """This request's place among those waiting for the same server (1: next)."""
        with self._cond:
            if ticket.number not in self._waiting:
                return 0
            target = self._target(self._session(ticket.session))
            return sum(1 for number, other in self._waiting.items() if number <= ticket.number
                       and self._target(self._session(other.session)) == target)

    def waiting_on(self, ticket: Ticket) -> tuple[str, ...]:
        """The other sessions this request waits behind: earlier requests for the same
        server, else those holding its slots. Empty when it waits only on its own session
        (the save of its state after its last turn): a session never queues behind itself."""
        with self._cond:
            session = self._session(ticket.session)
            target = self._target(session)
            names: list[str] = []
            for number, other in self._waiting.items():
                if number == ticket.number:
                    break
                if self._target(self._session(other.session)) == target:
                    names.append(other.session)
            slots = self._servers[target].slots
            if not names and not any(s.holder == session.key for s in slots):
                for s in slots:
                    if s.leased:
                        names.append(s.lessee)
                    elif s.saving and (saved := self._by_key(s.holder or "")) is not None:
                        names.append(saved.name)
            return tuple(dict.fromkeys(n for n in names if n and n != ticket.session))

    def take(self, ticket: Ticket, timeout: float) -> Lease | None:
        """A lease for ``ticket`` within ``timeout`` seconds, or None (ask again)."""
        end = time.monotonic() + timeout
        with self._cond:
            while True:
                granted = self._grant(ticket)
                if granted is not None:
                    break
                left = end - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(left)
        return self._prepare(granted)

    def _grant(self, ticket: Ticket) -> _Grant | None:
        """Under the lock: mark a slot leased to ``ticket`` when it is its turn."""
        session = self._session(ticket.session)
        target = self._target(session)
        for number, other in self._waiting.items():
            if number == ticket.number:
                break
            if self._target(self._session(other.session)) == target:
                return None  # an earlier request waits for this server: first come first
        server = self._servers[target]
        pick = pick_slot(session.key, server.slots)
        if pick is None:
            return None
        self._waiting.pop(ticket.number, None)
        slot = server.slots[pick.slot]
        save_first = pick.kind == "evict" and slot.dirty and server.store is not None
        slot.leased, slot.lessee, slot.used = True, ticket.session, next(self._clock)
        self._sessions[session.name] = self._sessions.pop(session.name)  # most recent last
        if pick.kind != "kept":
            slot.holder, slot.dirty = None, False
        session.home = target
        note = ""
        if pick.kind != "kept":
            note, session.note = session.note, ""
        self._cond.notify_all()
        return _Grant(session, target, pick, save_first, note)

    def _target(self, session: _Session) -> int:
        return pick_server(session.home, [
            (s.alive, sum(1 for x in s.slots if x.holder is None and not x.leased),
             sum(1 for x in s.slots if not x.leased and not x.saving)) for s in self._servers
        ])

    def _prepare(self, grant: _Grant) -> Lease:
        """Outside the lock: save what the slot held, restore what the session needs."""
        target, pick, session = grant.target, grant.pick, grant.session
        server = self._servers[target]
        try:
            if grant.save_first and pick.evicted is not None:
                self._save(target, pick.slot, pick.evicted)
            if pick.kind == "kept":
                use = SlotUse(server.url, pick.slot, SlotState.KEPT)
            else:
                use = self._restore(target, pick.slot, session, grant.note)
        except BaseException:
            self._release(target, pick.slot, None)
            raise
        return Lease(session.name, target, pick.slot, server.client, use)

    def give_back(self, lease: Lease, outcome: Completion | InferError) -> None:
        """The request ended: the slot holds the session's state, changed since its save.

        Whatever the outcome, what the slot holds is a prefix of the session's next prompt
        (a cancelled request keeps the part of its prompt already processed) or nothing
        (after a failed restore; saving nothing leaves the older file in place).
        """
        session = self._session(lease.session)
        self._release(lease.server, lease.slot, session.key, session.base)

    def abandon(self, lease: Lease) -> None:
        """``lease`` ends before its request was sent (cancelled while warming its slot):
        what the slot holds is not known, so it holds nobody's state."""
        self._release(lease.server, lease.slot, None)

    def turn_ended(self, session: str) -> None:
        """``session``'s turn is over (answered or not): with ``save_after_turn`` its changed
        state is saved now, in the saver thread, after the answer was shown; its slot waits
        for that save. Only the turn knows its last request: a small model's call written
        as text is an answer without tool calls to the server, and a save after it would
        hold up the turn's next request."""
        with self._cond:
            if not self._settings.save_after_turn or self._closed:
                return
            key = self._session(session).key
            for target, server in enumerate(self._servers):
                for slot in server.slots:
                    if (slot.holder == key and slot.dirty and not slot.leased
                            and not slot.saving and server.store is not None):
                        slot.saving = True
                        if self._saver is None:
                            self._saver = threading.Thread(
                                target=self._save_loop, name="slot-saver", daemon=True)
                            self._saver.start()
                        self._saves.put((target, slot.index, key))

    def save_now(self, session: str, timeout: float = _SAVE_WAIT_S) -> None:
        """Bring ``session``'s saved state up to date, for a fork to copy: a save of it in
        flight is waited for (up to ``timeout``), and a state a slot holds changed since
        its last save is saved now. A state in a slot that a request of it has leased (a
        turn running) is left as it is: the fork copies the last save, and the turn's
        end saves the rest."""
        with self._cond:
            key = self._session(session).key
            holding = [(t, slot) for t, server in enumerate(self._servers) if server.alive
                       and server.store is not None for slot in server.slots
                       if slot.holder == key]
            self._cond.wait_for(lambda: not any(slot.saving for _, slot in holding),
                                timeout)
            todo = [(t, slot) for t, slot in holding
                    if slot.holder == key and slot.dirty and not slot.leased and not slot.saving]
            for _, slot in todo:
                slot.saving = True  # not leased meanwhile
        for target, slot in todo:
            ok = False
            try:
                ok = self._save(target, slot.index, key)
            finally:
                with self._cond:
                    slot.saving = False
                    if ok and slot.holder == key:
                        slot.dirty = False
                    self._cond.notify_all()

    def _release(self, target: int, index: int, holder: str | None,
                 base: tuple[str, int] | None = None) -> None:
        with self._cond:
            server = self._servers[target]
            slot = server.slots[index]
            slot.leased, slot.lessee = False, ""
            slot.holder, slot.dirty = holder, holder is not None and server.alive
            slot.base = base if holder is not None else None
            for other in server.slots:
                if other is not slot and holder is not None and other.holder == holder:
                    other.holder, other.dirty = None, False  # its state moved here
            self._cond.notify_all()

    def server_failed(self, lease: Lease, error: InferError) -> bool:
        """True when ``lease``'s server is dropped for not answering and the request should
        go to another one; False when the error stands (another kind, or no other server)."""
        if error.kind is not InferErrorKind.CONNECT:
            return False
        with self._cond:
            server = self._servers[lease.server]
            others = [s for s in self._servers if s.alive and s is not server]
            if not others or not server.alive:
                return bool(others)
            server.alive = False
            for slot in server.slots:
                slot.holder, slot.dirty, slot.base = None, False, None
            for s in self._sessions.values():
                if s.home == lease.server:
                    s.home, s.note = None, SERVER_CHANGED.format(url=server.url)
            self._cond.notify_all()
        self._say(f"llama-server {server.url} does not answer; its sessions move to "
                  f"{', '.join(s.url for s in others)}")
        return True

    def server_of(self, session: str) -> tuple[LlamaClient, int]:
        """The client of the server ``session`` uses (or would be given now) and its
        per-slot context in tokens (0: the server did not say)."""
        with self._cond:
            server = self._servers[self._target(self._session(session))]
            return server.client, server.n_ctx

    def slot_count(self) -> int:
        """The slots of every server together (``agents.max_parallel = "auto"``)."""
        with self._cond:
            return sum(len(server.slots) for server in self._servers)

    # --- saving and restoring ----------------------------------------------------------

    def _session(self, name: str) -> _Session:
        with self._cond:
            session = self._sessions.get(name)
            if session is None:
                log_dir = self._settings.log_dir
                key = slot_key(log_file(log_dir, name)) if log_dir is not None else name
                if len(self._sessions) >= _ENTRIES:
                    self._prune()
                session = self._sessions[name] = self._keys[key] = _Session(name, key)
            return session

    def _by_key(self, key: str) -> _Session | None:
        with self._cond:
            return self._keys.get(key)

    def _prune(self) -> None:
        """Under the lock: forget the least recently leased quarter of the sessions no slot
        holds, leases or saves and no request waits for (a session forgotten and used again
        starts from its file, on the server with most room, like a new one)."""
        slots = [slot for server in self._servers for slot in server.slots]
        holders = {slot.holder for slot in slots}
        busy = {slot.lessee for slot in slots} | {t.session for t in self._waiting.values()}
        idle = [n for n, s in self._sessions.items() if s.key not in holders and n not in busy]
        for name in idle[: max(1, len(self._sessions) // 4)]:
            self._keys.pop(self._sessions.pop(name).key, None)

    def forget(self, session: str) -> None:
        """``session`` was removed: its entry goes, and a slot holding its state (not
        leased) holds nobody's, so that no save brings its file back."""
        with self._cond:
            gone = self._sessions.pop(session, None)
            if gone is None:
                return
            self._keys.pop(gone.key, None)
            for server in self._servers:
                for slot in server.slots:
                    if slot.holder == gone.key and not slot.leased and not slot.saving:
                        slot.holder, slot.dirty, slot.base = None, False, None

    def entries(self) -> int:
        """How many sessions the keeper remembers (bounded: docs/slots.md)."""
        with self._cond:
            return len(self._sessions)

    @traced.kv_save
    def _save(self, target: int, index: int, key: str) -> bool:
        """Save slot ``index`` as ``key``'s state; False (and a note) when it failed."""
        server = self._servers[target]
        store = server.store
        session = self._by_key(key)
        if store is None or session is None:
            return False
        try:
            answer = server.client.slot_action(index, "save", store.save_name(key))
            tokens = server_values.count(answer.get("n_saved")) or 0
            telemetry.current().set("loopd.kv.saved_tokens", tokens)  # on loopd.kv_save
            telemetry.current().set("gen_ai.conversation.id", session.name)
            if tokens <= 0:
                store.discard_save(key)  # nothing in the slot: the older file stays
                return True
            now = time.time()
            store.commit(key, SlotFile(
                session=session.name, file=store.file_name(key), tokens=tokens,
                fingerprint=server.fingerprint, server=server.url, saved=now, used=now,
                bytes=server_values.count(answer.get("n_written")) or 0,
            ))
        except (InferError, OSError, ValueError, TypeError) as e:
            with self._cond:
                session.note = SAVE_FAILED.format(message=_said(e))
            return False
        with self._cond:
            session.note = ""
        self._bound(store, key)
        return True

    def _bound(self, store: SlotStore, key: str) -> None:
        """Keep ``store`` under ``slots.disk_mb`` after ``key``'s save; tell the sessions
        whose files went."""
        for gone in store.bound(self._settings.disk_bytes):
            lost = self._by_key(gone)
            if lost is not None:
                with self._cond:
                    lost.note = TOO_LARGE if gone == key else ""

    @traced.kv_restore
    def _restore(self, target: int, index: int, session: _Session, note: str) -> SlotUse:
        server = self._servers[target]

        def none(reason: str) -> SlotUse:
            return SlotUse(server.url, index, SlotState.NONE,
                           reason="; ".join(r for r in (note, reason) if r))

        store = server.store
        if store is None:
            return none(server.why_not)
        meta = store.meta(session.key)
        found = (store.size_crc(session.key, meta.bytes) if meta is not None and store.reachable
                 else None)
        problem = restore_problem(meta, server.fingerprint, found, store.reachable,
                                  server.n_ctx)
        if meta is not None and meta.origin:  # a fork's copy of its source's state
            note = "; ".join(r for r in (note, FORKED.format(origin=meta.origin)) if r)
        if problem or meta is None:
            return none(problem)
        with self._cond:
            server.slots[index].base = None  # a failed restore leaves the slot empty
        try:
            answer = server.client.slot_action(index, "restore", meta.file)
            tokens = server_values.count(answer.get("n_restored")) or 0
            ms = float(server_values.timings(answer.get("timings")).get("restore_ms", 0.0))
        except InferError as e:
            text = REFUSED if e.status == 400 else RESTORE_FAILED
            return none(text.format(message=_said(e)))
        except (ValueError, TypeError) as e:
            return none(RESTORE_FAILED.format(message=str(e)))
        store.touch(session.key, meta)
        with self._cond:
            slot = server.slots[index]
            slot.holder, slot.dirty, slot.base = session.key, False, session.base
        return SlotUse(server.url, index, SlotState.RESTORED, restored=tokens, restore_ms=ms,
                       reason=note)

    # --- the baseline: a new session starts warm (actors.inference.slots.baseline) ------

    def warm_start(self, lease: Lease, system: Mapping[str, Any],
                   tools: Sequence[Mapping[str, Any]], cancel: CancelToken,
                   deadline: float) -> Lease:
        """``lease`` with its slot holding the baseline (``system``, the system message, and
        ``tools``) when it holds none of its session's state: the slot keeps it when it
        already starts with it, else its saved state is restored, else it is processed now
        and saved for the next new session. The one way a new session or a fresh child
        agent starts warm; :class:`actors.inference.actor.Inference` calls it before every
        request. A baseline that cannot be restored says why (``SlotUse.baseline_loss``,
        the request's CacheLoss); the request then runs as it would have. Raises only
        InferError CANCELLED or TIMEOUT (``cancel``, ``deadline``); the caller then
        abandons the lease."""
        use = lease.use
        if (use.state is not SlotState.NONE or not self._settings.warm_start
                or system.get("role") != "system"):
            return lease
        server = self._servers[lease.server]
        session = self._session(lease.session)
        own = "; ".join(r for r in use.reason.split("; ") if r and r != NO_STATE)
        if server.no_template:  # said on the first request: none of it is tried again
            return lease
        try:
            prefix, key = self._prefix(server, system, tools)
        except InferError as e:
            if e.kind is InferErrorKind.CANCELLED:
                raise
            why = BASE_NO_TEMPLATE.format(message=_said(e))
            if e.status in (404, 501):  # no /apply-template: an older or another server
                server.no_template = why
                self._say(f"llama-server {server.url}: {why}; new sessions process their "
                          "system prompt and tools")
            return dataclasses.replace(lease, use=dataclasses.replace(use, reason=_join(
                own, why)))
        lock = self._base_lock(key)
        while not lock.acquire(timeout=0.05):  # another new session warms this baseline
            if cancel.cancelled:
                raise InferError.cancelled()
            if time.monotonic() >= deadline:
                raise InferError(InferErrorKind.TIMEOUT, "the baseline's warm start took "
                                 "longer than inference.timeout_s")
        try:
            use, base = self._warm(server, lease.slot, session, prefix, key, use, own, cancel,
                                   deadline)
        finally:
            lock.release()
        return dataclasses.replace(lease, use=use, baseline=base)

    def _base_lock(self, key: str) -> threading.Lock:
        with self._cond:
            return self._base_locks.setdefault(key, threading.Lock())

    def _prefix(self, server: _Server, system: Mapping[str, Any],
                tools: Sequence[Mapping[str, Any]]) -> tuple[str, str]:
        """The baseline's rendered prefix on ``server`` and its key (rendered once each)."""
        sent = json.dumps([system, list(tools)], sort_keys=True, default=str)
        with self._cond:
            known = server.prefixes.get(sent)
        if known is not None:
            return known
        a, b = (server.client.render(baseline.baseline_messages(system, text), tools)
                for text in baseline.PROBES)
        prefix = baseline.common_prefix(a, b)
        if not prefix:
            raise InferError(InferErrorKind.PROTOCOL, "the chat template shares no prefix")
        found = (prefix, baseline.baseline_key(prefix, len(server.slots)))
        with self._cond:
            if len(server.prefixes) >= _PREFIXES:  # the oldest first: one per config in use
                server.prefixes.pop(next(iter(server.prefixes)))
            server.prefixes[sent] = found
        return found

    def _warm(self, server: _Server, index: int, session: _Session, prefix: str, key: str,
              use: SlotUse, own: str, cancel: CancelToken,
              deadline: float) -> tuple[SlotUse, BaselineUse | None]:
        slot = server.slots[index]
        with self._cond:
            held = slot.base
        if held is not None and held[0] == key:
            with self._cond:
                session.base = held
            return (dataclasses.replace(use, reason=_join(own, BASE_HELD)),
                    BaselineUse(held[1]))
        store = server.store
        if store is None:  # no file to restore nor to save into: the request processes it
            return use, None
        meta = store.meta(key)
        found = (store.size_crc(key, meta.bytes) if meta is not None and store.reachable
                 else None)
        problem = restore_problem(meta, server.fingerprint, found, store.reachable,
                                  server.n_ctx)
        if meta is not None and not problem:
            with self._cond:
                slot.base = None  # a failed restore leaves the slot empty
            try:
                answer = server.client.slot_action(index, "restore", meta.file)
                tokens = server_values.count(answer.get("n_restored")) or 0
                ms = float(server_values.timings(answer.get("timings")).get("restore_ms", 0.0))
                problem = "" if tokens > 0 else RESTORED_NOTHING
            except InferError as e:
                problem = (REFUSED if e.status == 400 else RESTORE_FAILED).format(
                    message=_said(e))
            except (ValueError, TypeError) as e:
                problem = RESTORE_FAILED.format(message=str(e))
            if not problem:
                store.touch(key, meta)
                with self._cond:
                    slot.base = session.base = (key, tokens)
                return (dataclasses.replace(use, state=SlotState.RESTORED, restored=tokens,
                                            restore_ms=ms, reason=_join(own, BASE_RESTORED)),
                        BaselineUse(tokens))
        loss = "" if problem == NO_STATE else BASE_LOST.format(why=problem)
        expected = meta.tokens if meta is not None else 0
        try:
            done = server.client.prefill(prefix, index, cancel, deadline)
        except InferError as e:
            if e.kind in (InferErrorKind.CANCELLED, InferErrorKind.TIMEOUT):
                raise
            with self._cond:
                slot.base = None
            use = dataclasses.replace(use, reason=_join(
                own, loss, BASE_NOT_PROCESSED.format(message=_said(e))))
            return use, (BaselineUse(expected, loss) if loss else None)
        timings = server_values.timings(done.get("timings"))
        tokens = int(timings.get("cache_n", 0)) + int(timings.get("prompt_n", 0))
        processed = BASE_PROCESSED.format(tokens=int(timings.get("prompt_n", 0)),
                                          ms=float(timings.get("prompt_ms", 0.0)))
        with self._cond:
            slot.base = session.base = (key, tokens)
        saved = self._save_baseline(server, store, index, key)
        return (dataclasses.replace(use, reason=_join(own, loss, processed, saved)),
                BaselineUse(tokens, loss))

    def _save_baseline(self, server: _Server, store: SlotStore, index: int, key: str) -> str:
        """Save slot ``index`` (holding just the baseline) as ``key``; what happened."""
        tag = str(os.getpid())  # other processes may save the same baseline at once
        try:
            answer = server.client.slot_action(index, "save", store.save_name(key, tag))
            tokens = server_values.count(answer.get("n_saved")) or 0
            if tokens <= 0:
                store.discard_save(key, tag)
                return BASE_NOT_SAVED.format(message="the slot was empty")
            now = time.time()
            store.commit(key, tag=tag, meta=SlotFile(
                session=baseline.BASELINE_SESSION, file=store.file_name(key), tokens=tokens,
                fingerprint=server.fingerprint, server=server.url, saved=now, used=now,
                bytes=server_values.count(answer.get("n_written")) or 0,
            ))
        except (InferError, OSError, ValueError, TypeError) as e:
            return BASE_NOT_SAVED.format(message=_said(e))
        for unused in baseline.unused_baselines(store.all(), baseline.KEPT):
            store.remove(unused)
        self._bound(store, key)
        return BASE_SAVED

    def _save_loop(self) -> None:
        while (job := self._saves.get()) is not None:
            target, index, key = job
            ok = False
            try:
                ok = self._save(target, index, key)
            except Exception:  # never the saver's end: later turns would wait for it for ever
                log.exception("saving the KV state of %s failed", key)
            finally:
                with self._cond:
                    slot = self._servers[target].slots[index]
                    slot.saving = False
                    if ok and slot.holder == key:
                        slot.dirty = False
                    self._cond.notify_all()

    def close(self) -> None:
        """Wait for saves in flight, then save every state that changed since its last save.

        The World calls this when a command ends (its end, Ctrl-C, SIGTERM), before the model
        server stops. Safe to call twice.
        """
        with self._cond:
            if self._closed:
                return
            self._closed = True
            saver = self._saver
        if saver is not None:
            self._saves.put(None)
            saver.join()
        with self._cond:
            todo = [(i, slot.index, slot.holder) for i, server in enumerate(self._servers)
                    if server.alive and server.store is not None for slot in server.slots
                    if slot.dirty and not slot.leased and slot.holder is not None]
        for target, index, key in todo:
            if self._save(target, index, key):
                with self._cond:
                    self._servers[target].slots[index].dirty = False


def _join(*parts: str) -> str:
    return "; ".join(p for p in parts if p)


def _said(e: Exception) -> str:
    return e.message if isinstance(e, InferError) else str(e)


def _probe(spec: ServerSpec, client: LlamaClient, settings: KeeperSettings,
           say: Callable[[str], None]) -> _Server:
    """A server as its ``/props`` describes it, and whether it can save slots."""
    try:
        props = client.props()
    except InferError as e:
        props = {}
        say(f"llama-server {spec.url} did not give its /props ({e.message}): "
            "assuming one slot, KV state not kept")
    slots = _int(props.get("total_slots"), 1)
    settings_ = props.get("default_generation_settings")
    n_ctx = _int(settings_.get("n_ctx") if isinstance(settings_, Mapping) else None, 0)
    model = spec.identity or _model_identity(props)
    # The slot count too: with one KV stream a slot (llama-server's default for an explicit
    # -np), a state saved with another count is refused ("n_stream mismatch").
    fingerprint = (f"model={model};n_ctx={n_ctx};slots={slots};"
                   f"build={props.get('build_info', '?')}")
    server = _Server(spec.url, client, [_Slot(i) for i in range(max(1, slots))], fingerprint,
                     None, n_ctx)
    where = spec.save_dir if spec.save_dir is not None else settings.meta_dir
    if not props:
        server.why_not = NO_PERSISTENCE.format(why="no /props")
    elif where is None:
        server.why_not = NO_PERSISTENCE.format(why="no place for its metadata")
    else:
        try:
            client.slot_action(0, _PROBE)
        except InferError as e:
            if e.status == 400:  # "Invalid action": it has a save path
                server.store = SlotStore(where, reachable=spec.save_dir is not None)
            elif e.status == 501:
                server.why_not = NO_SAVE_PATH
                say(f"llama-server {spec.url} has no --slot-save-path: sessions' KV state is "
                    "kept only while it runs (start it with --slot-save-path DIR to keep it "
                    "across commands)")
            else:
                server.why_not = NO_PERSISTENCE.format(why=f"its slot actions fail: {e.message}")
                say(f"llama-server {spec.url}: {server.why_not}")
    return server


def _model_identity(props: Mapping[str, Any]) -> str:
    """The model file's path, and its size when it is on this machine."""
    path = str(props.get("model_path", "?"))
    with contextlib.suppress(OSError):
        return f"{path}:{os.stat(path).st_size}"
    return path


def _int(value: object, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default
