"""The decision word (TOOL / ANSWER) is taken off the answer and off its stream, once."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors.base.events import Content, Event, Progress, Retrying
from actors.session.smallmodel.bare_json import could_be_call
from actors.session.smallmodel.decision_word import (
    ANSWER,
    ANSWER_VALUE,
    TOOL,
    WordFilter,
    about_the_workspace,
    asked_steps,
    asks_a_size,
    named_files,
    names_a_file,
    place_named,
    refers_back,
    strip_word,
)


def test_the_word_is_taken_off_once_and_other_text_is_left_alone() -> None:
    assert strip_word('TOOL {"name": "list_dir", "arguments": {}}') == (
        '{"name": "list_dir", "arguments": {}}'
    )
    assert strip_word("ANSWER ANSWER is a word.") == "ANSWER is a word."
    assert strip_word("ANSWERS are here.") == "ANSWERS are here."
    assert strip_word("ANSWER: 17") == "17"  # a value's word (arithmetic)
    assert strip_word("ANSWER : 17") == ": 17"
    assert strip_word("The answer.") == "The answer."
    assert strip_word(None) is None


def _streamed(pieces: list[str], *, retry_at: int | None = None, word: bool = True,
              bare: bool = False, flush: bool = False) -> tuple[str, list[Event]]:
    seen: list[Event] = []
    sink = WordFilter(seen.append, word=word, bare=bare)
    for i, piece in enumerate(pieces):
        if i == retry_at:
            sink(Retrying(attempt=1, delay=0.0, reason="stream broke"))
        sink(Content(piece))
    if flush:
        sink.flush()
    text = "".join(e.text for e in seen if isinstance(e, Content))
    return text, seen


def _cut(whole: str, data: st.DataObject) -> list[str]:
    cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(whole) - 1)), max_size=6)))
    cuts = [c for c in cuts if c < len(whole)]
    return [whole[a:b] for a, b in zip([0, *cuts], [*cuts, len(whole)], strict=True)]


@given(st.text(min_size=1, max_size=40), st.booleans(), st.sampled_from([ANSWER, ANSWER_VALUE]),
       st.data())
def test_however_the_stream_is_cut_the_person_sees_the_answer_without_the_word(
    answer: str, bare: bool, word: str, data: st.DataObject
) -> None:
    text, _ = _streamed(_cut(word + answer, data), bare=bare, flush=True)
    assert text == answer


CALL = '{"name": "read_file", "arguments": {"path": "notes.txt"}}'


@given(st.booleans(), st.booleans(), st.data())
def test_after_the_word_tool_nothing_of_the_call_is_shown(
    bare: bool, flush: bool, data: st.DataObject
) -> None:
    text, _ = _streamed(_cut(TOOL + CALL, data), bare=bare, flush=flush)
    assert text == ""


@pytest.mark.parametrize("call", [CALL, f"  {CALL}\n", f"```json\n{CALL}\n```",
                                  f"```\n{CALL}\n```", f"```JSON \r\n{CALL}```"])
@given(data=st.data())
def test_a_bare_call_is_held_back_until_the_end_of_the_stream(
    call: str, data: st.DataObject
) -> None:
    text, _ = _streamed(_cut(call, data), word=False, bare=True)  # taken as a call: no flush
    assert text == ""


@pytest.mark.parametrize("answer", ["The file says: buy seeds.", "```python\nprint(1)\n```",
                                    "`notes.txt` says hello.", "``` text"])
def test_text_that_cannot_be_a_bare_call_is_shown_as_it_comes(answer: str) -> None:
    seen: list[Event] = []
    sink = WordFilter(seen.append, word=False, bare=True)
    for ch in answer:
        sink(Content(ch))
    shown = "".join(e.text for e in seen if isinstance(e, Content))
    assert shown == answer  # before any flush: nothing waits for the end
    assert not could_be_call(answer)


def test_json_that_is_no_call_is_shown_when_the_stream_ends() -> None:
    text, _ = _streamed(['{"total": ', "3}"], word=False, bare=True)
    assert text == ""
    text, _ = _streamed(['{"total": ', "3}"], word=False, bare=True, flush=True)
    assert text == '{"total": 3}'


def test_a_retry_drops_what_was_held_back() -> None:
    text, _ = _streamed(['{"name": "re', "Sorry, here it is."], retry_at=1, word=False,
                        bare=True, flush=True)
    assert text == "Sorry, here it is."


def test_a_retry_looks_for_the_word_again_and_other_events_pass_at_once() -> None:
    text, seen = _streamed(["ANSW", "ER Paris", ".", "ANSWER", " Rome."], retry_at=3)
    assert text == "Paris.Rome."
    assert any(isinstance(e, Retrying) for e in seen)
    progress = Progress(processed=1, total=2, cache=0)
    out: list[Event] = []
    WordFilter(out.append)(progress)
    assert out == [progress]


def test_once_decided_each_chunk_is_passed_on_as_it_came() -> None:
    """After the word (or with none to look for) a chunk is not rebuilt: the same event."""
    for word, first in ((True, "ANSWER "), (False, "The")):
        out: list[Event] = []
        sink = WordFilter(out.append, word=word)
        chunks = [Content(first), Content(" The"), Content(" capital"), Content(" is Paris.")]
        for chunk in chunks:
            sink(chunk)
        assert out[-2] is chunks[2] and out[-1] is chunks[3]
        sink(Retrying(attempt=2, delay=0.0, reason="x"))  # looks for the word again
        sink(Content("ANSWER Rome."))
        assert "".join(e.text for e in out if isinstance(e, Content)).endswith(
            " is Paris." + ("Rome." if word else "ANSWER Rome."))


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


def test_a_question_is_about_the_workspace_when_its_files_hold_one_of_its_words() -> None:
    """Names, places, versions and rarer words count; the words any question uses, plain
    numbers and short lower-case words do not; a folder too big to tell (None) never."""
    words = frozenset({"omar", "haddad", "lyon", "rent", "march", "2.3.1", "2", "3", "1",
                       "tom", "what", "files", "12", "day", "deployed", "version", "city"})
    about = ["In which city does Omar Haddad work?", "How much will the rent be from March?",
             "Who deployed version 2.3.1?", "Which files mention Tom?", "Which is 2.3.1?"]
    not_about = ["What is the capital of France?", "What files are there?",
                 "What is 12 plus 30?", "How many hours are in a day?",
                 "What does the second one say?", "tom is here", "What is 2 plus 3?"]
    assert [q for q in about if not about_the_workspace(q, words)] == []
    assert [q for q in not_about if about_the_workspace(q, words)] == []
    assert about_the_workspace("In which city does Omar Haddad work?", words) == (
        "city", "Omar", "Haddad", "Omar Haddad")  # as written, and two in a row
    assert about_the_workspace("Is Tom's rent due?", words) == ("Tom", "rent")
    assert about_the_workspace("Which versions?", words) == ()  # as written only
    assert not about_the_workspace("In which city does Omar Haddad work?", None)
    assert not about_the_workspace("In which city does Omar Haddad work?", frozenset())


def test_the_tools_a_question_asks_for_by_their_verbs() -> None:
    assert asked_steps("Search for backup, then read the file you found.") == (
        "search_files", "read_file")
    assert asked_steps("List the recipes folder, then open the soup recipe.") == (
        "list_dir", "read_file")
    assert asked_steps("Read a.txt and write its first line to b.txt.") == (
        "read_file", "write_file")
    assert asked_steps("Read recipes/pizza.md and tell me what it says.") == ("read_file",)
    assert asked_steps("Read a.txt, then read b.txt.") == ("read_file",)  # one tool
    assert asked_steps("Who wrote Dune? Look in reading-list.md.") == ()


def test_the_files_a_question_names_and_whether_it_asks_a_size() -> None:
    assert named_files("Read recipes/soup.md, then a.txt.") == ["recipes/soup.md", "a.txt"]
    assert named_files("What is 3.14 times 2?") == []
    sizes = ["How big is access.log?", "How many bytes is ideas.md?", "What size is a.txt?"]
    assert [q for q in sizes if not asks_a_size(q)] == []
    assert not asks_a_size("Which page gave a 404 in access.log?")
    assert not asks_a_size("What does big-file.txt say?")  # a word of the file's name


def test_a_question_that_refers_back_to_an_earlier_list() -> None:
    back = ["What does the second one say?", "And the last one?", "Show me the third file."]
    assert [q for q in back if not refers_back(q)] == []
    assert not refers_back("Who came second in one race?")
    assert not refers_back("What does notes.txt say?")


def test_the_place_a_question_names() -> None:
    assert place_named("What does the second one say?") == 2
    assert place_named("Show me the last file.") == -1
    assert place_named("What does notes.txt say?") is None
