"""The workspace map's text: what a new session on the embedded model is told the folder holds."""

from __future__ import annotations

import os
from pathlib import Path

from actors.session.smallmodel.workspace_map import MAP_HEADER, render_map, workspace_map
from actors.tools.protocol.workspace import Entry


def test_the_map_is_a_line_per_entry_sorted_by_path() -> None:
    text = render_map([Entry("b.txt", 5), Entry("docs", None), Entry("a.md", 0),
                       Entry("docs/x.csv", 1200)], more=False)
    assert text.splitlines() == [MAP_HEADER, "a.md  0", "b.txt  5", "docs/", "docs/x.csv  1200"]


def test_a_capped_map_says_so_and_how_to_see_the_rest() -> None:
    text = render_map([Entry("a", None)], more=True)
    assert text.splitlines()[-1].startswith("(only the first 1 entries are shown; list_dir")


def test_an_empty_workspace_and_no_workspace(tmp_path: Path) -> None:
    assert render_map([], more=False) == "The workspace is empty."
    assert workspace_map(tmp_path / "missing", (), 40) == ""
    assert workspace_map(tmp_path, (), 0) == ""  # off


def test_the_map_of_a_folder_leaves_out_loopds_places_and_what_the_tools_refuse(
    tmp_path: Path,
) -> None:
    ws = tmp_path / "ws"
    (ws / "sessions" / "s").mkdir(parents=True)
    (ws / "sessions" / "s" / "log.bin").write_bytes(b"x")
    (ws / ".git").mkdir()
    (ws / ".git" / "HEAD").write_text("ref")
    (ws / "notes.txt").write_text("hello")
    (ws / "out").symlink_to(tmp_path)
    os.mkfifo(ws / "pipe")
    for i in range(50):
        (ws / "many" / f"f{i:02}.txt").parent.mkdir(exist_ok=True)
        (ws / "many" / f"f{i:02}.txt").write_text("y")
    text = workspace_map(ws, (str(ws / "sessions"),), 5)
    assert text.splitlines() == [
        MAP_HEADER, "many/", "many/f00.txt  1", "many/f01.txt  1", "many/f02.txt  1",
        "notes.txt  5",
        "(only the first 5 entries are shown; list_dir shows a folder's files)"]
