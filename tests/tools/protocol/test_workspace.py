"""Workspace's own rules, on a real directory tree: the walk, symlinks, kinds of file, links.

The same rules through a real tool host, and the attacks on them (a directory swapped for
a symlink mid-walk, a FIFO, a hardlink out), are in tests/faults/test_file_faults.py.
"""

from __future__ import annotations

import os
import resource
import socket
from pathlib import Path
from typing import NamedTuple

import pytest

from actors.base.errors import UsageError
from actors.tools.protocol.workspace import (
    MAX_DEPTH,
    MultiplyLinked,
    NotRegular,
    Opened,
    OutsideWorkspace,
    Refused,
    Workspace,
)


class Tree(NamedTuple):
    ws: Workspace
    root: Path
    outside: Path


@pytest.fixture
def tree(tmp_path: Path) -> Tree:
    root, outside = tmp_path / "ws", tmp_path / "out"
    (root / "sub" / "deeper").mkdir(parents=True)
    outside.mkdir()
    (outside / "secret.txt").write_text("outside")
    (root / "a.txt").write_text("a")
    (root / "sub" / "b.txt").write_text("b")
    (root / "sub" / "deeper" / "c.txt").write_text("c")
    (root / "rel_in").symlink_to("sub/b.txt")
    (root / "abs_in").symlink_to(root / "sub")
    (root / "up_in").symlink_to("../ws/a.txt")  # leaves the root and comes back: outside
    (root / "sub" / "parent").symlink_to("..")
    (root / "out_file").symlink_to(outside / "secret.txt")
    (root / "out_dir").symlink_to(outside)
    (root / "loop1").symlink_to("loop2")
    (root / "loop2").symlink_to("loop1")
    return Tree(Workspace(root), root, outside)


def _read(opened: Opened) -> str:
    try:
        return os.pread(opened.fd, 100, 0).decode()
    finally:
        opened.close()


def test_relative_and_absolute_paths_inside(tree: Tree) -> None:
    ws, root, _ = tree
    assert _read(ws.open_read("a.txt")) == "a"
    assert _read(ws.open_read("./sub//b.txt")) == "b"
    assert _read(ws.open_read(str(root / "sub" / "deeper" / "c.txt"))) == "c"
    assert _read(ws.open_read("sub/deeper/../b.txt")) == "b"
    opened = ws.open_read("sub/deeper/../../a.txt")
    assert opened.rel == "a.txt"
    opened.close()


@pytest.mark.parametrize(
    "path",
    ["..", "../out/secret.txt", "sub/../../out/secret.txt", "/etc/passwd", "/", "out_file",
     "out_dir/secret.txt", "up_in", "sub/parent/../out/secret.txt"],
)  # fmt: skip
def test_every_way_out_is_refused(tree: Tree, path: str) -> None:
    with pytest.raises(OutsideWorkspace, match="outside the workspace"):
        tree.ws.open_read(path)


def test_symlinks_inside_are_followed_by_the_walk_and_named_as_walked(tree: Tree) -> None:
    ws, _, _ = tree
    opened = ws.open_read("rel_in")
    assert (_read(opened), opened.rel) == ("b", "sub/b.txt")
    opened = ws.open_read("abs_in/deeper/c.txt")
    assert (_read(opened), opened.rel) == ("c", "sub/deeper/c.txt")
    top = ws.open_dir("sub/parent")  # ".." from sub: the root itself
    assert top.rel == "."
    top.close()


def test_a_symlink_loop_is_refused_not_followed_for_ever(tree: Tree) -> None:
    with pytest.raises(Refused, match="more than 40 symlinks"):
        tree.ws.open_read("loop1")


def test_what_is_not_there_or_not_a_file(tree: Tree) -> None:
    ws, _, _ = tree
    with pytest.raises(FileNotFoundError):
        ws.open_read("missing.txt")
    with pytest.raises(FileNotFoundError):
        ws.open_dir("missing")
    with pytest.raises(IsADirectoryError):
        ws.open_read("sub")
    with pytest.raises(IsADirectoryError):
        ws.open_write(".")
    with pytest.raises(NotADirectoryError):
        ws.open_dir("a.txt")
    with pytest.raises(NotADirectoryError):
        ws.open_read("a.txt/x")
    with pytest.raises(OutsideWorkspace, match="NUL"):
        ws.open_read("a\0b")


def test_a_workspace_must_be_a_directory(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="is not a directory"):
        Workspace(tmp_path / "nope")


def test_fifos_and_sockets_are_refused_without_blocking(tree: Tree) -> None:
    ws, root, _ = tree
    os.mkfifo(root / "pipe")
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(root / "sock"))
    try:
        for opener in (ws.open_read, ws.open_write):
            with pytest.raises(NotRegular, match="pipe is a FIFO, not a regular file"):
                opener("pipe")
            with pytest.raises(NotRegular, match="sock is a socket, not a regular file"):
                opener("sock")
    finally:
        s.close()


def test_write_makes_directories_inside_and_writes_only_after_the_checks(tree: Tree) -> None:
    ws, root, outside = tree
    opened = ws.open_write("new/dir/f.txt")
    os.write(opened.fd, b"written")
    opened.close()
    assert opened.rel == "new/dir/f.txt"
    assert (root / "new" / "dir" / "f.txt").read_text() == "written"
    (root / "a.txt").write_text("long old text")
    opened = ws.open_write("a.txt")  # emptied once opened and checked
    opened.close()
    assert (root / "a.txt").read_text() == ""
    with pytest.raises(OutsideWorkspace):
        ws.open_write("out_dir/made/f.txt")
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]


def test_a_file_with_other_hard_links_is_read_but_never_written(tree: Tree) -> None:
    ws, root, outside = tree
    os.link(outside / "secret.txt", root / "hard.txt")
    with pytest.raises(MultiplyLinked, match=r"hard\.txt has 2 hard links"):
        ws.open_write("hard.txt")
    assert (outside / "secret.txt").read_text() == "outside"  # not even emptied
    assert _read(ws.open_read("hard.txt")) == "outside"


def test_files_walks_regular_files_in_name_order_skipping_links_and_named_dirs(
    tree: Tree,
) -> None:
    ws, root, _ = tree
    os.mkfifo(root / "sub" / "pipe")
    (root / "node_modules").mkdir()
    (root / "node_modules" / "m.js").write_text("m")
    top = ws.open_dir(".")
    try:
        files = ws.files(top, frozenset({"node_modules"}))
        seen = [(f.rel, os.pread(f.fd, 10, 0).decode()) for f in files]
    finally:
        top.close()
    assert seen == [("a.txt", "a"), ("sub/b.txt", "b"), ("sub/deeper/c.txt", "c")]


def test_files_closes_what_it_opened(tree: Tree) -> None:
    ws, _, _ = tree
    before = len(os.listdir("/proc/self/fd"))
    top = ws.open_dir("sub")
    names = [f.rel for f in ws.files(top)]
    top.close()
    assert names == ["sub/b.txt", "sub/deeper/c.txt"]
    assert len(os.listdir("/proc/self/fd")) == before


def test_files_holds_one_descriptor_per_level_and_stops_at_max_depth(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    root.mkdir()
    for i in range(2000):  # wide: more directories than the process may hold open below
        (root / f"d{i:04}").mkdir()
    (root / "d1999" / "last.txt").write_text("x")
    deep = root / "deep"
    for _ in range(MAX_DEPTH + 5):
        deep = deep / "n"
    deep.mkdir(parents=True)
    (deep / "too_deep.txt").write_text("x")
    (deep.parents[10] / "deep_enough.txt").write_text("x")
    ws = Workspace(root)
    top = ws.open_dir(".")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, 512), hard))  # fewer than 2000
    try:
        names = [f.rel.rsplit("/", 1)[-1] for f in ws.files(top)]
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        top.close()
    assert names == ["last.txt", "deep_enough.txt"]


def test_loopds_own_places_in_the_workspace_are_refused(tmp_path: Path) -> None:
    """A workspace that holds loopd's logs and rules file (a home directory, say): the file
    tools neither read nor write them, by any way in, and nothing is made or emptied."""
    root = tmp_path / "home"
    logs = root / ".local" / "sessions"
    (logs / "s").mkdir(parents=True)
    (logs / "s" / "log.bin").write_bytes(b"loopdlog conversation")
    (root / "rules.toml").write_text('allow = []\n')
    (root / "notes.txt").write_text("mine")
    os.symlink(".local", root / "way")
    ws = Workspace(root, hidden=[str(logs), str(root / "rules.toml"), "/elsewhere"])
    for path in (".local/sessions/s/log.bin", "way/sessions/s/log.bin", str(logs / "s/log.bin"),
                 "way/../way/sessions/s/log.bin", "rules.toml"):
        with pytest.raises(Refused, match="loopd's own data"):
            ws.open_read(path)
        with pytest.raises(Refused, match="loopd's own data"):
            ws.open_write(path)
    with pytest.raises(Refused, match="loopd's own data"):
        ws.open_write(".local/sessions/new/log.bin")
    with pytest.raises(Refused, match="loopd's own data"):
        ws.open_dir("way/sessions")
    assert (logs / "s" / "log.bin").read_bytes() == b"loopdlog conversation"  # not emptied
    assert not (logs / "new").exists()  # nothing made
    assert (root / "rules.toml").read_text() == "allow = []\n"
    top = ws.open_dir(".")
    try:
        found = [f.rel for f in ws.files(top)]
    finally:
        top.close()
    assert found == ["notes.txt"]  # search passes them over
    assert [e.path for e in ws.tree(100)[0]] == [".local", "notes.txt"]  # so does the map
    ws.open_read("notes.txt").close()  # the rest works as before


def test_tree_is_breadth_first_capped_and_keeps_the_file_tools_rule(tree: Tree) -> None:
    """The workspace map's walk: the top level first; symlinks (in or out), FIFOs and the
    skipped directories left out, as the search leaves them; at most ``limit`` entries."""
    ws, root, _ = tree
    os.mkfifo(root / "sub" / "pipe")
    (root / "node_modules").mkdir()
    (root / "node_modules" / "m.js").write_text("m")
    (root / "sub" / "deeper" / "long.txt").write_text("x" * 1234)
    entries, more = ws.tree(100)
    assert [(e.path, e.size) for e in entries] == [
        ("a.txt", 1), ("sub", None), ("sub/b.txt", 1), ("sub/deeper", None),
        ("sub/deeper/c.txt", 1), ("sub/deeper/long.txt", 1234)]
    assert not more
    entries, more = ws.tree(3)
    assert [e.path for e in entries] == ["a.txt", "sub", "sub/b.txt"] and more
    assert ws.tree(6)[1] is False  # exactly all of them: nothing left out
    assert ws.tree(0) == ([], True)


def test_tree_holds_one_descriptor_at_a_time(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    root.mkdir()
    for i in range(600):  # more directories than the process may hold open below
        (root / f"d{i:03}").mkdir()
    (root / "d599" / "last.txt").write_text("x")
    ws = Workspace(root)
    before = len(os.listdir("/proc/self/fd"))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, 256), hard))
    try:
        entries, more = ws.tree(10_000)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert not more and entries[-1].path == "d599/last.txt" and len(entries) == 601
    assert len(os.listdir("/proc/self/fd")) == before


@pytest.mark.parametrize(
    "path",
    ["a.txt", "rel_in", "abs_in/deeper/c.txt", "abs_in/new/dir/x.txt", "sub/parent/a.txt",
     "sub/deeper/../new.txt", "dangling", "through/b.txt", "missing/../a2.txt",
     "sub/deeper/d.txt"],
)  # fmt: skip
def test_landing_is_where_the_write_lands(tree: Tree, path: str) -> None:
    """The dry walk (nothing made, nothing opened for writing) names the file the write then
    opens: links at the end (a dangling one too), in a parent, absolute, and `..`."""
    ws, root, _ = tree
    (root / "dangling").symlink_to("sub/not-yet/x.txt")
    (root / "through").symlink_to("sub")
    before = sorted(str(p) for p in root.rglob("*"))
    landing = ws.landing(path)
    assert sorted(str(p) for p in root.rglob("*")) == before  # nothing made
    opened = ws.open_write(path)
    opened.close()
    assert opened.rel == landing


@pytest.mark.parametrize("path", ["..", "out_file", "out_dir/secret.txt", "up_in", "/etc/x"])
def test_a_landing_outside_is_refused(tree: Tree, path: str) -> None:
    with pytest.raises(OutsideWorkspace):
        tree.ws.landing(path)


def test_the_guard_stops_a_write_before_it_makes_or_opens_anything(tree: Tree) -> None:
    ws, root, _ = tree
    seen: list[tuple[str, bool]] = []

    def guard(rel: str, leaf: bool) -> None:
        seen.append((rel, leaf))
        raise Refused(f"not {rel}")

    with pytest.raises(Refused, match="not sub/new"):
        ws.open_write("abs_in/new/x.txt", guard)
    assert seen == [("sub/new", False)] and not (root / "sub" / "new").exists()
    with pytest.raises(Refused, match=r"not sub/b\.txt"):
        ws.open_write("rel_in", guard)  # the link is walked; the guard sees where it leads
    assert (root / "sub" / "b.txt").read_text() == "b"
