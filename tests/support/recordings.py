"""Where the real llama-server recordings are: ``tests/fixtures/http``, byte for byte."""

from __future__ import annotations

from pathlib import Path

__all__ = ["FIXTURES"]

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "http"
