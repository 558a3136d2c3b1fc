"""Nothing raw reaches the person's terminal, nor a script reading a pipe.

No byte of text from outside loopd (a model's, a tool's, a server's) reaches the terminal as
a control sequence: :func:`visible` shows every control character (C0 but newline and tab,
DEL, C1, the bidirectional overrides) as text, and :class:`SafeConsole`, the one console
every command prints through, applies it to each string it is given and to every piece of
text it writes (rich's own cursor moves, which it marks as control, pass). A JSON line
(:func:`json_line`) escapes what JSON leaves raw. A reader that goes away (``| head``) ends
the command quietly (:class:`ReaderGone`, :func:`quiet`).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from typing import IO, Any

from rich.console import Console
from rich.segment import Segment
from rich.text import Text

__all__ = ["ReaderGone", "SafeConsole", "json_line", "quiet", "visible"]


def _shown(code: int) -> str:
    if code < 0x20:
        return "^" + chr(code + 0x40)  # ESC -> ^[, CR -> ^M, backspace -> ^H
    if code == 0x7F:
        return "^?"
    return f"\\x{code:02x}" if code < 0x100 else f"<U+{code:04X}>"


# C0 but newline and tab (layout needs them), DEL, C1 (U+009B is a CSI to some terminals),
# and the bidirectional controls that make text show in another order than it runs
_CONTROLS = [*(c for c in range(0x20) if c not in (0x09, 0x0A)), 0x7F, *range(0x80, 0xA0),
             0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A)]
_VISIBLE = {code: _shown(code) for code in _CONTROLS}
_ANY_CONTROL = re.compile("[" + "".join(f"\\u{c:04x}" for c in _CONTROLS) + "]")
_JSON_RAW = {code: f"\\u{code:04x}" for code in _CONTROLS if code >= 0x7F}


def visible(text: str) -> str:
    """``text`` with every control character shown as text (``^[`` for ESC, ``^M`` for CR,
    ``\\x9b``, ``<U+202E>``): what a terminal shows is what the text holds, from its first
    character. Newlines and tabs stay."""
    return text.translate(_VISIBLE) if _ANY_CONTROL.search(text) else text


def json_line(data: Any) -> str:
    """``data`` as one JSON line, without a raw control character: JSON escapes C0 itself;
    DEL, C1 and the bidirectional controls are escaped here (the same text once parsed)."""
    line = json.dumps(data, ensure_ascii=False)
    return line.translate(_JSON_RAW) if _ANY_CONTROL.search(line) else line


class SafeConsole(Console):
    """A rich console that writes no control sequence it was not told to: every string it is
    given goes through :func:`visible` before markup is read (rich would drop CR and
    backspace unseen), and every piece of text it writes once more (a Text built elsewhere,
    a table cell); only segments rich marks as control (its own cursor moves) pass."""

    def render_str(self, text: str, **kwargs: Any) -> Text:
        return super().render_str(visible(text), **kwargs)

    def _render_buffer(self, buffer: Iterable[Segment]) -> str:
        return super()._render_buffer(
            segment if segment.control or not _ANY_CONTROL.search(segment.text)
            else Segment(visible(segment.text), segment.style) for segment in buffer)


class ReaderGone(KeyboardInterrupt):
    """stdout's reader went away: cancel the turn like Ctrl-C, then end without a word."""


def quiet(stream: IO[str]) -> None:
    """Point ``stream``'s descriptor at /dev/null: its reader has gone (a broken pipe)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, stream.fileno())
    finally:
        os.close(devnull)
