"""A session worth forking (session src: 40 long turns and a saved KV state) and the saved
states a fork leaves, for the tests that kill a fork or fill its disk."""

from __future__ import annotations

import time
from pathlib import Path

from actors.base.config import Config
from actors.inference.slots.files import SlotFile, SlotStore, slot_key
from actors.log.file import SessionLog
from actors.log.records import Assistant, Baseline, User, now

__all__ = ["source", "states"]


def source(config: Config) -> Path:
    """Session src: 40 turns with long answers (a log of some size), and a saved KV state."""
    path = config.log_dir / "src" / "log.bin"
    base = Baseline(system="s", tools=(), model="m", created=now())
    log, _ = SessionLog.open(path, baseline=base, name="src")
    with log:
        for n in range(40):
            log.append(User(content=f"q{n}"), Assistant(content=f"a{n} " * 2000, reasoning=None))
    store = SlotStore(Path(config.slots.save_dir), reachable=True)
    key = slot_key(path)
    store.dir.mkdir(parents=True, exist_ok=True)
    (store.dir / store.save_name(key)).write_bytes(b"kv" * 4096)
    when = time.time()
    store.commit(key, SlotFile(session="src", file=store.file_name(key), tokens=900,
                               fingerprint="model=m", server="http://127.0.0.1:1", saved=when,
                               used=when, bytes=0))
    return path


def states(config: Config) -> dict[str, SlotFile]:
    """The saved states in the save directory, by the session they are for."""
    return {meta.session: meta for _, meta in
            SlotStore(Path(config.slots.save_dir), reachable=True).all()}
