"""Where the real llama-server recordings are: ``../shared/fixtures/http`` beside the repo."""

from __future__ import annotations

from pathlib import Path

__all__ = ["FIXTURES"]

FIXTURES = Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "http"
