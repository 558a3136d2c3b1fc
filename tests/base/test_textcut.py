"""actors/base/textcut.py: the one routine every cap uses, cut in characters or in UTF-8 bytes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors.base.textcut import cut

# Characters of each UTF-8 length: 1, 2, 3 and 4 bytes.
WIDE = ["a", "é", "€", "😀"]
# Text a tool or model gives: any code point but lone surrogates (see the surrogate test).
texts = st.text(st.characters(blacklist_categories=("Cs",)), max_size=60)


def limits_for(size: int) -> range:
    """Every limit that cuts a text of ``size``, and a few around it (each example tries all)."""
    return range(-2, size + 3)

# Bytes as files have them: characters of each width, and what UTF-8 never has in that place
# (lone continuation bytes and runs of them, unfinished characters, 0xFF, a surrogate).
binaries = st.lists(
    st.sampled_from([
        b"A", b"\n", "é".encode(), "€".encode(), "😀".encode(),
        b"\x80", b"\xbf" * 6, b"\xe2\x82", b"\xf0", b"\xff", b"\xed\xa0\x80",
    ]),
    max_size=30,
).map(b"".join)


# --- characters ----------------------------------------------------------------------------


def test_chars_keep_the_first_limit_characters_and_say_both_sizes() -> None:
    assert cut("héllo wörld", 5, "chars") == ("héllo", 5, 11)


def test_chars_under_the_limit_come_back_whole() -> None:
    assert cut("abc", 3, "chars") == ("abc", 3, 3)
    assert cut("abc", 1000, "chars") == ("abc", 3, 3)
    assert cut("", 5, "chars") == ("", 0, 0)


@pytest.mark.parametrize("limit", [0, -1, -100])
def test_a_limit_of_zero_or_less_keeps_nothing(limit: int) -> None:
    assert cut("abc", limit, "chars") == ("", 0, 3)
    assert cut("abc", limit, "bytes") == ("", 0, 3)


def test_chars_of_given_bytes_count_the_decoded_text() -> None:
    assert cut("€uro".encode(), 2, "chars") == ("€u", 2, 4)
    assert cut(b"\xffab", 2, "chars") == ("\ufffda", 2, 3)  # a bad byte is one replaced char


@given(texts)
def test_chars_keep_the_longest_prefix_within_the_limit(text: str) -> None:
    for limit in limits_for(len(text)):
        kept, size, total = cut(text, limit, "chars")
        assert text.startswith(kept)
        assert size == len(kept) == min(len(text), max(0, limit))
        assert total == len(text)


# --- bytes ---------------------------------------------------------------------------------


def test_bytes_keep_ascii_up_to_the_limit() -> None:
    assert cut("abcdef", 4, "bytes") == ("abcd", 4, 6)
    assert cut(b"abcdef", 6, "bytes") == ("abcdef", 6, 6)


@pytest.mark.parametrize("char", WIDE[1:])
def test_a_character_that_would_cross_the_limit_is_left_out_whole(char: str) -> None:
    """Every limit that falls inside the character: none of its bytes is kept."""
    width = len(char.encode())
    text = "ab" + char + "cd"
    for inside in range(1, width):
        limit = 2 + inside
        assert cut(text, limit, "bytes") == ("ab", 2, 4 + width)
        assert cut(text.encode(), limit, "bytes") == ("ab", 2, 4 + width)
    assert cut(text, 2 + width, "bytes") == ("ab" + char, 2 + width, 4 + width)


def test_bytes_of_a_str_count_its_utf8_size() -> None:
    assert cut("€€€", 7, "bytes") == ("€€", 6, 9)


@given(texts)
def test_bytes_keep_the_longest_whole_character_prefix_within_the_limit(text: str) -> None:
    """Never over the limit, always valid text, and a prefix no character longer would fit."""
    for limit in limits_for(len(text.encode())):
        kept, size, total = cut(text, limit, "bytes")
        assert text.startswith(kept)
        assert size == len(kept.encode()) <= max(0, limit)
        assert total == len(text.encode())
        rest = text[len(kept) :]
        if rest:  # the next character would not have fitted
            assert size + len(rest[0].encode()) > limit


@given(st.lists(st.sampled_from(WIDE), max_size=40).map("".join))
def test_given_utf8_bytes_are_cut_like_their_text(text: str) -> None:
    for limit in limits_for(len(text.encode())):
        assert cut(text.encode(), limit, "bytes") == cut(text, limit, "bytes")


def test_bytes_that_are_not_utf8_are_cut_at_most_one_character_short() -> None:
    """A binary file is a run of bytes that are no characters: the cut may leave out at most
    the 3 bytes of an unfinished character, or a reader told "read on with offset=N" never
    gets further (cut said it kept nothing)."""
    data = b"a" + b"\x80" * 100
    kept, size, total = cut(data, 50, "bytes")
    assert (size, total) == (50, 101)
    assert kept == data[:50].decode("utf-8", "replace")


@given(binaries)
def test_any_bytes_keep_at_least_limit_less_three_and_say_what_they_kept(data: bytes) -> None:
    for limit in limits_for(len(data)):
        kept, size, total = cut(data, limit, "bytes")
        assert total == len(data)
        assert min(len(data), max(0, limit) - 3) <= size <= max(0, limit)
        assert kept == data[:size].decode("utf-8", "replace")


def test_a_lone_surrogate_in_text_is_kept_as_it_is_not_as_stray_bytes() -> None:
    """JSON may carry lone surrogates ("\\ud800"); the cut keeps a prefix of the text and
    leaves the wire to deal with them, instead of three replacement characters."""
    assert cut("\ud800abc", 4, "bytes") == ("\ud800a", 4, 6)
    assert cut("a\ud800bc", 3, "bytes") == ("a", 1, 6)
