"""The words of a small workspace, to tell a question about its files from one that is not.

The embedded model decides for itself whether a question needs a tool (the decision word,
:mod:`actors.session.smallmodel.decision_word`), and on folders it was not tuned on it often
answers a question about them from nothing: "In which city does Omar Haddad work?" got
"Omar Haddad works in Cairo." (staff.csv says Lyon), "Who deployed version 2.3.1?" got
"William Shakespeare" (the system prompt's Hamlet example). A question that names a file
already gets a call first; :func:`workspace_words` lets the turn do the same for a question
with a word that the workspace's files hold (:func:`actors.session.smallmodel.decision_word.
about_the_workspace`): the names, places, versions and rarer words of its files.

Only a small folder is read: the files the search reads (the file tools' rule: loopd's own
places, symlinks, special files and :data:`~actors.tools.protocol.workspace.SKIP_DIRS` left
out), their names and text, up to ``cap`` bytes in all. A bigger folder holds most words of
any question (this repository holds "capital", "planet" and "thank"), so past the cap there
are no words and the model decides alone, as before. Read at each turn's first request, so a
file written in the session counts at the next question.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path

from actors.base.errors import UsageError
from actors.tools.protocol.workspace import SKIP_DIRS, Workspace

__all__ = ["MAX_FILES", "WORD", "Holdings", "words_of", "workspace_words"]

MAX_FILES = 256  # more files than this: too big to tell, like more bytes than the cap

# A word: letters and digits, and the same joined by dots, dashes or apostrophes (2.3.1,
# q1-summary, o'brien) as a word of its own besides its parts.
WORD = re.compile(r"[^\W_]+")
_JOINED = re.compile(r"[^\W_]+(?:[.'-][^\W_]+)+")


def words_of(text: str) -> set[str]:
    """The words of ``text``, lower case: each run of letters and digits, and each run of
    them joined by ``.``, ``-`` or ``'``."""
    low = text.lower()
    return {*WORD.findall(low), *_JOINED.findall(low)}


@dataclasses.dataclass(frozen=True, slots=True)
class Holdings:
    """What a small workspace holds: the words of its files' names and text, its files'
    paths and its folders' ("." for the top), each in name order."""

    words: frozenset[str]
    files: tuple[str, ...]
    folders: tuple[str, ...]
    spread: Mapping[str, int] = dataclasses.field(default_factory=dict)  # files per word

    def rarest(self, terms: Iterable[str]) -> tuple[str, ...]:
        """Those of ``terms`` that the fewest files hold (a term of two words: as many
        as its rarer word), in their order: the most telling to search for."""
        def files(term: str) -> int:
            return min(self.spread.get(w, 0) or len(self.files) + 1 for w in term.lower().split())
        counted = [(files(t), t) for t in terms]
        fewest = min((n for n, _ in counted), default=0)
        return tuple(t for n, t in counted if n == fewest)


def workspace_words(root: Path, hidden: Iterable[str], cap: int) -> Holdings | None:
    """The words of the names and text of the files under ``root`` that the search reads,
    and their paths; None when they hold more than ``cap`` bytes (or ``cap`` is 0, or there
    is no such directory, or there are more than :data:`MAX_FILES` files): the folder is too
    big to tell anything by its words."""
    if cap <= 0:
        return None
    try:
        workspace = Workspace(root, hidden=hidden)
        top = workspace.open_dir(".")
    except (UsageError, OSError):
        return None
    found: set[str] = set()
    spread: Counter[str] = Counter()
    files: list[str] = []
    folders: dict[str, None] = {".": None}
    left = cap
    try:
        for file in workspace.files(top, SKIP_DIRS):
            files.append(file.rel)
            if len(files) > MAX_FILES:
                return None
            parts = file.rel.split("/")[:-1]
            folders.update({"/".join(parts[:i]): None for i in range(1, len(parts) + 1)})
            data = _read(file.fd, left + 1)
            left -= len(data)
            if left < 0:
                return None
            these = words_of(file.rel.replace("/", " ")) | words_of(
                data.decode("utf-8", "replace"))
            found |= these
            spread.update(these)
    except OSError:
        return None
    finally:
        top.close()
    return Holdings(frozenset(found), tuple(files), tuple(folders), dict(spread))


def _read(fd: int, most: int) -> bytes:
    """Up to ``most`` bytes of the open file ``fd``."""
    parts: list[bytes] = []
    while most > 0:
        part = os.read(fd, min(most, 65536))
        if not part:
            break
        parts.append(part)
        most -= len(part)
    return b"".join(parts)
