"""Fork, rewind and compact through a real ``loopd serve``: the protocol, the Python client,
the CLI, and the in-use rule (a session attached to another client is not rewound or
compacted)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from actors.base.errors import SessionInUse, UsageError
from actors.log.file import read_records
from actors.log.records import Compaction, CompactionBy, Forked, Rewind, User
from tests.daemon.daemonkit import Daemon, chat, cli, daemon_config
from tests.support.fake_llama import FakeLlama
from tests.support.scripted_llama import agent
from tests.support.terminal import leave
from tests.support.watch import HANG_S
from tests.tools.hostkit import short_dir


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    with short_dir() as d, FakeLlama(agent()) as fake, Daemon(
        daemon_config(tmp_path, d / "run", fake.url)
    ) as running:
        yield running


def quiet(_event: object) -> None:
    pass


def test_fork_through_the_client_while_another_client_has_the_source(daemon: Daemon) -> None:
    logs = daemon.config.log_dir
    with daemon.client() as a, daemon.client() as b:
        a.turn("src", "t1 :: list_dir {}").run(quiet)
        a.turn("src", "t2 :: list_dir {}").run(quiet)
        before = (logs / "src" / "log.bin").read_bytes()
        forked = b.fork("src", "new")
        assert (forked.session, forked.source, forked.at) == ("new", "src", 2)
        assert forked.state_tokens == 0  # the fake server keeps no files
        early = b.fork("src", "early", 1)
        assert early.at == 1
        assert (logs / "src" / "log.bin").read_bytes() == before
        new = read_records(logs / "new" / "log.bin")
        assert new[:-1] == read_records(logs / "src" / "log.bin")
        assert isinstance(new[-1], Forked) and new[-1].from_ == "src"
        outcome = b.turn("new", "t3 :: list_dir {}").run(quiet)
        assert outcome.content == "done t3."
        with pytest.raises(UsageError, match="session new exists"):
            b.fork("src", "new")
        a.turn("src", "t4 :: list_dir {}").run(quiet)  # the source goes on, its own way
    users = [r.content for r in read_records(logs / "early" / "log.bin") if isinstance(r, User)]
    assert users == ["t1 :: list_dir {}"]


def test_rewind_obeys_the_in_use_rule(daemon: Daemon) -> None:
    logs = daemon.config.log_dir
    with daemon.client() as a, daemon.client() as b:
        a.turn("s", "t1 :: list_dir {}").run(quiet)
        a.turn("s", "t2 :: list_dir {}").run(quiet)
        with pytest.raises(SessionInUse, match="session s is in use by another client"):
            b.rewind("s")
        refused = cli(daemon.config_path, "rewind", "s")
        assert refused.returncode == 5 and "in use by another client" in refused.stderr
        rewound = a.rewind("s")
        assert (rewound.to_turn, rewound.taken, rewound.left) == (1, (2,), (1,))
        a.turn("s", "t3 :: list_dir {}").run(quiet)
        a.close_session("s")
        done = cli(daemon.config_path, "rewind", "s", "--turns", "2")  # free again: works
        assert done.returncode == 0, done.stderr
        assert "took back turns 1, 3" in " ".join(done.stderr.split())
        with pytest.raises(UsageError, match="has no turns to take back"):
            b.rewind("s")
    records = read_records(logs / "s" / "log.bin")
    assert [r.to_turn for r in records if isinstance(r, Rewind)] == [1, 0]


def test_a_rewind_waits_for_no_turn_it_is_refused_while_one_runs(daemon: Daemon) -> None:
    ws = Path(daemon.config.tools.workspace)
    hold = "for i in $(seq 1 3000); do [ -f go.flag ] && exit 0; sleep 0.02; done"
    command = f'run_command {{"command": "{hold}"}}'
    with daemon.client() as a:
        a.turn("s", "t1 :: list_dir {}").run(quiet)
        turn = a.turn("s", f"t2 :: {command}")
        events = iter(turn)
        next(e for e in events if type(e).__name__ == "ToolCallStarted")
        with pytest.raises(UsageError, match="a turn is already running on session s"):
            a.rewind("s")
        (ws / "go.flag").write_text("")
        finished = threading.Thread(target=lambda: list(events))
        finished.start()
        finished.join(HANG_S)
        assert turn.outcome is not None
        assert a.rewind("s").taken == (2,)


def test_fork_and_rewind_through_the_cli(daemon: Daemon) -> None:
    with daemon.client() as a:
        a.turn("src", "t1 :: list_dir {}").run(quiet)
    forked = cli(daemon.config_path, "sessions", "fork", "src", "new", "--at", "1")
    assert forked.returncode == 0, forked.stderr
    assert "session new: forked from src at turn 1" in " ".join(forked.stderr.split())
    bad = cli(daemon.config_path, "sessions", "fork", "src", "other", "--at", "5")
    assert bad.returncode == 2 and "session src has turns 1 to 1" in bad.stderr
    rewound = cli(daemon.config_path, "rewind", "new")
    assert rewound.returncode == 0, rewound.stderr
    assert "starts the conversation afresh" in " ".join(rewound.stderr.split())


def test_undo_in_a_chat_through_the_daemon(daemon: Daemon) -> None:
    with chat(daemon.config_path, "c") as child:
        child.expect("Ctrl-D leaves")
        child.expect("> ")
        for n in (1, 2):
            child.sendline(f"t{n} :: list_dir {{}}")
            child.expect(rf"done t{n}\.")
            child.expect("> ")
        # the chat's client has it attached: nobody else rewinds it
        with daemon.client() as other, pytest.raises(SessionInUse):
            other.rewind("c")
        child.sendline("/undo")
        child.expect("took back turn 2")
        child.expect("> ")
        child.sendline("t3 :: list_dir {}")
        child.expect(r"done t3\.")
        child.expect("> ")
        leave(child)
    records = read_records(daemon.config.log_dir / "c" / "log.bin")
    assert [r.to_turn for r in records if isinstance(r, Rewind)] == [1]
    assert [r.content for r in records if isinstance(r, User)] == [
        "t1 :: list_dir {}", "t2 :: list_dir {}", "t3 :: list_dir {}"]


def test_compact_through_the_client_obeys_the_in_use_rule(daemon: Daemon) -> None:
    logs = daemon.config.log_dir
    with daemon.client() as a, daemon.client() as b:
        for tag in ("t1", "t2", "t3"):
            a.turn("c", f"{tag} :: list_dir {{}}").run(quiet)
        with pytest.raises(SessionInUse, match="session c is in use by another client"):
            b.compact("c")
        done = a.compact("c")
        # the first turn is summarised, the last two fit compact_keep and stay verbatim
        assert (done.session, done.turns_kept) == ("c", 2) and done.tokens_after > 0
        outcome = a.turn("c", "t4 :: list_dir {}").run(quiet)  # goes on from the summary
        assert outcome.content == "done t4."
        a.close_session("c")
        b.open("empty")
        with pytest.raises(UsageError, match="nothing to compact"):
            b.compact("empty")  # no turn yet
    records = read_records(logs / "c" / "log.bin")
    (compaction,) = [r for r in records if isinstance(r, Compaction)]
    assert compaction.by is CompactionBy.PERSON and compaction.summary
