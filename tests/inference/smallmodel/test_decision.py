"""The decision word (TOOL / ANSWER) is taken off the answer and off its stream, once."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from actors.base.events import Content, Event, Progress, Retrying
from actors.inference.smallmodel.decision import WORDS, WordFilter, names_a_file, strip_word


def test_the_word_is_taken_off_once_and_other_text_is_left_alone() -> None:
    assert strip_word('TOOL {"name": "list_dir", "arguments": {}}') == (
        '{"name": "list_dir", "arguments": {}}'
    )
    assert strip_word("ANSWER ANSWER is a word.") == "ANSWER is a word."
    assert strip_word("ANSWERS are here.") == "ANSWERS are here."
    assert strip_word("The answer.") == "The answer."
    assert strip_word(None) is None


def _streamed(pieces: list[str], *, retry_at: int | None = None) -> tuple[str, list[Event]]:
    seen: list[Event] = []
    sink = WordFilter(seen.append)
    for i, piece in enumerate(pieces):
        if i == retry_at:
            sink(Retrying(attempt=1, delay=0.0, reason="stream broke"))
        sink(Content(piece))
    text = "".join(e.text for e in seen if isinstance(e, Content))
    return text, seen


@given(st.sampled_from(WORDS), st.text(min_size=1, max_size=40), st.data())
def test_however_the_stream_is_cut_the_person_sees_the_answer_without_the_word(
    word: str, answer: str, data: st.DataObject
) -> None:
    whole = word + answer
    cuts = sorted(data.draw(st.sets(st.integers(1, len(whole) - 1), max_size=6)))
    pieces = [whole[a:b] for a, b in zip([0, *cuts], [*cuts, len(whole)], strict=True)]
    text, _ = _streamed(pieces)
    assert text == answer


def test_a_retry_looks_for_the_word_again_and_other_events_pass_at_once() -> None:
    text, seen = _streamed(["ANSW", "ER Paris", ".", "ANSWER", " Rome."], retry_at=3)
    assert text == "Paris.Rome."
    assert any(isinstance(e, Retrying) for e in seen)
    progress = Progress(processed=1, total=2, cache=0)
    out: list[Event] = []
    WordFilter(out.append)(progress)
    assert out == [progress]


def test_text_without_a_word_is_passed_on_whole() -> None:
    text, _ = _streamed(["AN", "D then"])
    assert text == "AND then"


def test_a_question_names_a_file_by_a_name_and_an_extension() -> None:
    named = ["What does notes.txt say?", "Show me a.md.", "Read recipes/pizza.md and tell me.",
             "How many bytes is budget.txt? List it.", "Is it in the file todo.md."]
    not_named = ["What is 12 plus 30?", "Who is J.K. Rowling?", "Say it, e.g. twice.",
                 "What is 3.14 times 2?", "Go to example.com.au now", "What files are there?"]
    assert [q for q in named if not names_a_file(q)] == []
    assert [q for q in not_named if names_a_file(q)] == []
