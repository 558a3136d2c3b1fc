"""The words of a small workspace (names and text of the files the search reads), or None."""

from __future__ import annotations

import os
from pathlib import Path

from actors.session.smallmodel.workspace_words import MAX_FILES, words_of, workspace_words


def test_words_are_lower_case_runs_and_joined_runs() -> None:
    assert words_of("Version 2.3.1 by O'Brien, q1-summary.md") == {
        "version", "2", "3", "1", "2.3.1", "by", "o", "brien", "o'brien", "q1", "summary",
        "md", "q1-summary.md"}


def test_the_words_of_the_names_and_text_of_the_files(tmp_path: Path) -> None:
    (tmp_path / "letters").mkdir()
    (tmp_path / "letters" / "2024-01-15-landlord.txt").write_text("The rent rises to 950.")
    (tmp_path / "staff.csv").write_text("name,city\nOmar Haddad,Lyon\n")
    found = workspace_words(tmp_path, (), 1000)
    assert found is not None
    assert {"letters", "landlord", "rent", "950", "omar", "haddad", "lyon", "staff"} <= found.words
    assert "cairo" not in found.words
    assert found.files == ("letters/2024-01-15-landlord.txt", "staff.csv")
    assert found.folders == (".", "letters")


def test_a_folder_past_the_cap_or_none_has_no_words(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("x" * 600)
    (tmp_path / "b.txt").write_text("y" * 600)
    assert workspace_words(tmp_path, (), 1000) is None  # 1200 bytes: too big to tell
    assert workspace_words(tmp_path, (), 1200) is not None
    assert workspace_words(tmp_path, (), 0) is None  # off
    assert workspace_words(tmp_path / "missing", (), 1000) is None
    for i in range(MAX_FILES):
        (tmp_path / f"e{i}").touch()
    assert workspace_words(tmp_path, (), 10**6) is None  # more files than MAX_FILES


def test_what_the_file_tools_refuse_or_the_search_skips_is_not_read(tmp_path: Path) -> None:
    (tmp_path / "sessions").mkdir()
    (tmp_path / "sessions" / "log.txt").write_text("secretword")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "HEAD").write_text("gitword")
    outside = tmp_path.parent / f"{tmp_path.name}-outside.txt"
    outside.write_text("linkedword")
    (tmp_path / "link.txt").symlink_to(outside)
    os.mkfifo(tmp_path / "pipe")
    (tmp_path / "notes.txt").write_text("plainword")
    try:
        found = workspace_words(tmp_path, (str(tmp_path / "sessions"),), 1000)
    finally:
        outside.unlink()
    assert found is not None and "plainword" in found.words
    assert not {"secretword", "gitword", "linkedword", "pipe", "sessions"} & found.words
    assert found.files == ("notes.txt",) and found.folders == (".",)


def test_the_rarest_terms_are_those_the_fewest_files_hold(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("bank card 4821")
    (tmp_path / "b.txt").write_text("Northfield Bank, March")
    (tmp_path / "c.txt").write_text("rent from March")
    found = workspace_words(tmp_path, (), 1000)
    assert found is not None
    assert found.spread["bank"] == 2 and found.spread["card"] == 1
    assert found.rarest(("bank", "card", "bank card")) == ("card", "bank card")
    assert found.rarest(("rent", "March")) == ("rent",)
    assert found.rarest(()) == ()
