"""A compaction's wording taken out of streamed text: the same whatever the chunks."""

from __future__ import annotations

import random

import pytest

from actors.base.events import AnswerCut, Content, Event
from actors.session.compaction import ELIDE_HEADER
from actors.session.frame_words import PIECES, FrameFilter, frame_piece, unframed
from actors.session.messages import OUTSIDE_FRAME, SUMMARY_FRAME

MIXED = ("Sure. The person asked: What is this project for? And you answered: a CLI kit. "
         + SUMMARY_FRAME.format(summary="They read setup.py.") + " Then the person asks.")


@pytest.mark.parametrize("text", [
    MIXED, OUTSIDE_FRAME.format(summary="x"), f"{ELIDE_HEADER}\n- The person asked: a",
    "no\nlonger   fits the CONTEXT, so. (3 earlier lines left out)", "[loopd: [loopd: ok",
])
def test_no_piece_is_left_whatever_the_chunks(text: str) -> None:
    whole = unframed(text)
    assert frame_piece(whole) is None and frame_piece(text) is not None
    for seed in range(60):
        rnd, out = random.Random(seed), []
        chunks = FrameFilter(out.append, lambda: True)
        at = 0
        while at < len(text):
            step = rnd.randint(1, 7)
            chunks(Content(text[at:at + step]))
            at += step
        chunks.flush()
        assert "".join(e.text for e in out if isinstance(e, Content)) == whole == chunks.text


def test_the_persons_content_stays() -> None:
    assert unframed(MIXED) == ("Sure. What is this project for? And a CLI kit. \n\nThey "
                               "read setup.py.\n\nThen the person asks.")
    plain = "The summary of notes.txt: the club meets on Saturday, then goes on from here."
    assert unframed(plain) == plain and all(p == p.lower() for p in PIECES)


def test_held_text_comes_before_a_cut_and_nothing_when_inactive() -> None:
    out: list[Event] = []
    held = FrameFilter(out.append, lambda: True)
    held(Content("It says: the person"))
    held(AnswerCut(why="copy", note="n", tokens=3))
    assert out == [Content("It says: "), Content("the person"), AnswerCut("copy", "n", 3)]
    out.clear()
    off = FrameFilter(out.append, lambda: False)
    off(Content("The person asked: x"))
    assert out == [Content("The person asked: x")]
    assert off.answer("The person asked: x") == "The person asked: x"
