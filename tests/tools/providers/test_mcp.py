"""MCP servers as tool hosts: the McpProvider against real MCP servers.

The servers are real: ``mcp-server-time`` and ``mcp-server-git`` from PyPI, and a tiny server
written with the SDK's own server API (tests/tools/mcp_test_server.py) for the faults a
published server will not produce on demand (a crash mid-call, a hang, a wedged loop).
"""

from __future__ import annotations

import base64
import importlib
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from hypothesis import given
from hypothesis import strategies as st

NO_CANCEL = threading.Event()  # never set: these calls run to their end


def _need(module: str) -> Any:
    """The module, or skip; in CI a missing extra is a failure, not a skip."""
    if os.environ.get("CI"):
        return importlib.import_module(module)
    return pytest.importorskip(module, reason=f"needs {module} (the test extra installs it)")


_need("mcp")

import mcp_types  # noqa: E402

from actors.base.errors import McpError  # noqa: E402
from actors.tools.protocol.spec import ResultClass  # noqa: E402
from actors.tools.protocol.wire import Failed, PendingApproval, Result  # noqa: E402
from actors.tools.providers.mcp import McpProvider  # noqa: E402
from actors.tools.providers.mcp_mapping import (  # noqa: E402
    describe_content,
    policy,
    result_text,
    tool_spec,
)
from actors.tools.registry import Registry  # noqa: E402
from tests.tools.mcp_support import (  # noqa: E402
    TEST_SERVER,
    TIME_SERVER,
    closed_port_url,
    http_test_server,
    mcp_port,
    refusing,
)

pytestmark = pytest.mark.mcp

# The call limit of every call that must answer: a hang guard (a server started again on a
# loaded machine takes seconds to finish its handshake). Calls meant to time out say 1 s.
CALL_S = 60.0
WAIT_S = 60.0  # upper bound for things that happen "soon"; never a speed assertion


def _wait_until(cond: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.02)


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.fixture
def make_provider() -> Iterator[Callable[..., McpProvider]]:
    """Builds providers and closes every one of them, even when the test fails."""
    made: list[McpProvider] = []

    def make(*args: Any, **kwargs: Any) -> McpProvider:
        provider = McpProvider(*args, **kwargs)
        made.append(provider)
        return provider

    try:
        yield make
    finally:
        for provider in made:
            provider.close()


@pytest.fixture
def record(tmp_path: Path) -> Path:
    return tmp_path / "cancelled.jsonl"


@pytest.fixture
def test_server(make_provider: Callable[..., McpProvider], record: Path) -> McpProvider:
    """The test server; a healthy one is never taken for wedged here, however busy the
    machine (the probe after a timed-out call waits as long as any call)."""
    command = [sys.executable, str(TEST_SERVER), "--record", str(record)]
    return make_provider(command, probe_timeout_s=CALL_S)


def _notes(record: Path) -> list[dict[str, Any]]:
    """What the test server recorded; a line still being written is not counted yet."""
    if not record.exists():
        return []
    return [json.loads(line) for line in record.read_text().splitlines(keepends=True)
            if line.endswith("\n")]


def _pid(provider: McpProvider) -> int:
    answer = provider.run("pid", {}, CALL_S, NO_CANCEL)
    assert isinstance(answer, Result), answer
    return int(answer.content)


# --- policy and mapping ---------------------------------------------------------------------

_hint = st.sampled_from([None, True, False])


@given(read_only=_hint, destructive=_hint, open_world=_hint, absent=st.booleans())
def test_annotations_only_choose_the_stricter_side(
    read_only: bool | None, destructive: bool | None, open_world: bool | None, absent: bool
) -> None:
    annotations = None if absent else mcp_types.ToolAnnotations(
        read_only_hint=read_only, destructive_hint=destructive, open_world_hint=open_world
    )
    needs_approval, untrusted = policy(annotations)
    if not needs_approval:  # only an explicit, consistent read-only claim skips approval
        assert not absent and read_only is True and destructive is not True
    if not untrusted:  # only an explicit closed-world claim makes results trusted
        assert not absent and open_world is False
    if absent:
        assert (needs_approval, untrusted) == (True, True)


def test_policy_table() -> None:
    A = mcp_types.ToolAnnotations
    assert policy(A(read_only_hint=True, open_world_hint=False)) == (False, False)
    assert policy(A(read_only_hint=True, destructive_hint=True)) == (True, True)
    assert policy(A(read_only_hint=False, destructive_hint=False)) == (True, True)  # additive
    assert policy(A(destructive_hint=False)) == (True, True)  # readOnly defaults to false
    assert policy(A(read_only_hint=True)) == (False, True)  # openWorld defaults to true


def test_tool_spec_carries_name_description_schema_and_policy() -> None:
    schema = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}
    tool = mcp_types.Tool(
        name="t",
        description="does t",
        input_schema=schema,
        annotations=mcp_types.ToolAnnotations(read_only_hint=True, open_world_hint=True),
    )
    spec = tool_spec(tool)
    assert (spec.name, spec.description, dict(spec.parameters)) == ("t", "does t", schema)
    assert (spec.needs_approval, spec.untrusted, spec.result_class) == (
        False, True, ResultClass.PUBLIC,
    )
    bare = tool_spec(mcp_types.Tool(name="u", input_schema={"type": "object"}))
    assert bare.description and bare.needs_approval and bare.untrusted


@given(data=st.binary(max_size=3000), kind=st.sampled_from(["image", "audio"]))
def test_binary_content_is_described_with_kind_type_and_size(data: bytes, kind: str) -> None:
    cls = mcp_types.ImageContent if kind == "image" else mcp_types.AudioContent
    block = cls(data=base64.b64encode(data).decode(), mime_type=f"{kind}/x-test")
    assert describe_content(block) == f"[{kind}: {kind}/x-test, {len(data):,} bytes; not shown]"


def test_resources_are_described_and_text_resources_kept() -> None:
    link = mcp_types.ResourceLink(uri="file:///a.txt", name="a", mime_type="text/plain", size=12)
    assert describe_content(link) == "[resource link: file:///a.txt (a, text/plain, 12 bytes)]"
    text = mcp_types.EmbeddedResource(
        resource=mcp_types.TextResourceContents(uri="file:///b", mime_type="text/x", text="body")
    )
    assert describe_content(text) == "[resource file:///b (text/x)]\nbody"
    blob = mcp_types.BlobResourceContents(uri="file:///c", blob=base64.b64encode(b"abcd").decode())
    assert describe_content(mcp_types.EmbeddedResource(resource=blob)) == (
        "[resource file:///c: type unknown, 4 bytes of binary data; not shown]"
    )


def test_bad_construction_says_what_to_fix(make_provider: Callable[..., McpProvider]) -> None:
    with pytest.raises(ValueError, match="exactly one of command"):
        McpProvider()
    with pytest.raises(ValueError, match="exactly one of command"):
        McpProvider(["x"], url="http://127.0.0.1:1/mcp")
    with pytest.raises(ValueError, match="non-empty list of strings"):
        McpProvider([])
    with pytest.raises(ValueError, match="http:// or https://"):
        McpProvider(url="ftp://example/mcp")
    with pytest.raises(McpError, match=r"'/nonexistent/mcp-server' was not found.*tools.hosts"):
        make_provider(["/nonexistent/mcp-server"])


def test_a_server_that_exits_at_start_is_an_error(
    make_provider: Callable[..., McpProvider],
) -> None:
    with pytest.raises(McpError, match="did not start"):
        make_provider([sys.executable, "-c", "import sys; sys.exit(2)"])


def test_a_server_that_never_answers_times_out_and_is_stopped(
    make_provider: Callable[..., McpProvider],
) -> None:
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(McpError, match="did not finish the MCP handshake within 1 s"):
        make_provider([sys.executable, "-c", "import time; time.sleep(600)"], connect_timeout_s=1)
    left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    assert all(_gone(p.pid) for p in left), left


def test_a_401_is_said_with_its_status_and_a_fix_that_fits_an_http_server(
    make_provider: Callable[..., McpProvider],
) -> None:
    with refusing(401) as url, pytest.raises(McpError) as refused:
        make_provider(url=url)
    said = str(refused.value)
    assert "answered HTTP 401 Unauthorized" in said
    assert 'WWW-Authenticate: Bearer realm="test"' in said
    assert 'bearer = "env:NAME"' in said and 'oauth = "authorization_code"' in said
    assert "run the command by hand" not in said  # advice for a command, not a url


def test_a_closed_port_says_to_check_the_url_not_to_run_a_command(
    make_provider: Callable[..., McpProvider],
) -> None:
    with pytest.raises(McpError) as refused:
        make_provider(url=closed_port_url())
    assert "is it running, and is url in [[tools.hosts]] its MCP endpoint?" in str(refused.value)


def test_a_result_that_breaks_its_output_schema_fails_the_call_and_keeps_the_server(
    test_server: McpProvider,
) -> None:
    before = test_server.run("pid", {}, CALL_S, NO_CANCEL)
    answer = test_server.run("bad_point", {}, CALL_S, NO_CANCEL)
    assert isinstance(answer, Failed)
    assert "Invalid structured content returned by tool bad_point" in answer.message
    # the same server process answers next: it was not taken for dead and restarted
    assert test_server.run("pid", {}, CALL_S, NO_CANCEL) == before
    assert test_server.run("point", {}, CALL_S, NO_CANCEL) != before


def test_structured_output_reaches_the_model_as_json_once(test_server: McpProvider) -> None:
    # the server sends {"x": 1, "y": 2} and, for older clients, the same as indented text
    answer = test_server.run("point", {}, CALL_S, NO_CANCEL)
    assert isinstance(answer, Result) and answer.content == '{"x":1,"y":2}'
    both = mcp_types.CallToolResult(
        content=[mcp_types.TextContent(text="a note"), mcp_types.TextContent(text='{"x": 1}')],
        structured_content={"x": 1},
    )
    assert result_text(both) == 'a note\n{"x":1}'
    wrapped = mcp_types.CallToolResult(content=[mcp_types.TextContent(text="added")],
                                       structured_content={"result": "added"})
    assert result_text(wrapped) == "added"  # a plain answer the SDK wrapped stays plain
    alone = mcp_types.CallToolResult(content=[], structured_content={"x": 1})
    assert result_text(alone) == '{"x":1}'


# --- a real server from PyPI: mcp-server-time ------------------------------------------------


def test_time_server_lists_its_tools_and_answers(make_provider: Callable[..., McpProvider]) -> None:
    _need("mcp_server_time")
    provider = make_provider(TIME_SERVER)
    specs = {s.name: s for s in provider.specs()}
    assert {"get_current_time", "convert_time"} <= set(specs)
    spec = specs["get_current_time"]
    assert spec.parameters["properties"]["timezone"]["type"] == "string"
    assert not spec.needs_approval and not spec.untrusted  # it says read-only, closed-world

    answer = provider.run("get_current_time", {"timezone": "Asia/Tokyo"}, CALL_S, NO_CANCEL)
    assert isinstance(answer, Result), answer
    assert json.loads(answer.content)["timezone"] == "Asia/Tokyo"

    bad = provider.run("get_current_time", {"timezone": "Nowhere/Atlantis"}, CALL_S, NO_CANCEL)
    assert isinstance(bad, Failed) and "Nowhere/Atlantis" in bad.message  # isError -> Failed


# --- a real server from PyPI: mcp-server-git --------------------------------------------------


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    subprocess.run([*git, "init", "-q"], check=True)
    (repo / "notes.txt").write_text("hello\n")
    subprocess.run([*git, "add", "notes.txt"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "first commit from the test"], check=True)
    return repo


def _status(repo: Path) -> str:
    git = ["git", "-C", str(repo), "status", "--porcelain"]
    return subprocess.run(git, capture_output=True, text=True, check=True).stdout


def test_git_server_reads_and_config_alone_allows_writes(
    make_provider: Callable[..., McpProvider], repo: Path
) -> None:
    _need("mcp_server_git")
    command = [sys.executable, "-m", "mcp_server_git", "--repository", str(repo)]
    provider = make_provider(command)
    specs = {s.name: s for s in provider.specs()}
    assert not specs["git_log"].needs_approval
    assert specs["git_add"].needs_approval  # additive write: destructiveHint false, not read-only

    log = provider.run("git_log", {"repo_path": str(repo)}, CALL_S, NO_CANCEL)
    assert isinstance(log, Result), log
    assert "first commit from the test" in log.content

    (repo / "new.txt").write_text("new\n")  # the host asks first; the provider only runs
    added = provider.run(
        "git_add", {"repo_path": str(repo), "files": ["new.txt"]}, CALL_S, NO_CANCEL
    )
    assert isinstance(added, Result), added
    assert "A  new.txt" in _status(repo)


# --- faults, with the tiny SDK server ---------------------------------------------------------


def test_content_mapping_through_a_real_server(test_server: McpProvider) -> None:
    media = test_server.run("media", {}, CALL_S, NO_CANCEL)
    assert isinstance(media, Result), media
    assert media.content.splitlines() == [
        "here are the files",
        "[image: image/png, 100 bytes; not shown]",
        "[audio: audio/wav, 1,000 bytes; not shown]",
    ]
    failed = test_server.run("fail", {}, CALL_S, NO_CANCEL)
    assert isinstance(failed, Failed) and "the tool failed on purpose" in failed.message
    unknown = test_server.run("no_such_tool", {}, CALL_S, NO_CANCEL)
    assert isinstance(unknown, Failed) and "no tool named 'no_such_tool'" in unknown.message


def test_long_answers_are_cut_with_a_note(make_provider: Callable[..., McpProvider]) -> None:
    provider = make_provider([sys.executable, str(TEST_SERVER)], max_output_bytes=10)
    answer = provider.run("echo", {"text": "é" * 20}, CALL_S, NO_CANCEL)  # 40 bytes of UTF-8
    assert answer == Result(content="é" * 5 + "\n[cut: showing 10 of 40 bytes of the answer]")
    assert provider.run("echo", {"text": "short"}, CALL_S, NO_CANCEL) == Result(content="short")


def test_unannotated_tools_need_approval_and_allow_never_trusts_results(
    make_provider: Callable[..., McpProvider],
) -> None:
    provider = make_provider([sys.executable, str(TEST_SERVER)])
    specs = {s.name: s for s in provider.specs()}
    assert specs["delete_all"].needs_approval and not specs["echo"].needs_approval
    echo = provider.run("echo", {"text": "x"}, CALL_S, NO_CANCEL)
    assert echo == Result(content="x", untrusted=False)
    web = provider.run("web", {}, CALL_S, NO_CANCEL)
    assert isinstance(web, Result) and web.untrusted  # openWorldHint: true
    deleted = provider.run("delete_all", {}, CALL_S, NO_CANCEL)
    assert deleted == Result(content="deleted", untrusted=True)  # no openWorldHint: untrusted


def test_a_crash_mid_call_fails_the_call_and_the_next_call_restarts(
    test_server: McpProvider,
) -> None:
    first = _pid(test_server)
    crashed = test_server.run("crash", {}, CALL_S, NO_CANCEL)
    assert isinstance(crashed, Failed), crashed
    assert "exited or closed the connection during the call to crash" in crashed.message
    assert "restarted for the next call" in crashed.message
    second = _pid(test_server)
    assert second != first
    _wait_until(lambda: _gone(first), "the crashed server to be reaped")
    assert test_server.run("echo", {"text": "again"}, CALL_S, NO_CANCEL) == Result(content="again")


def test_a_server_killed_between_calls_is_replaced_before_the_next_call(
    test_server: McpProvider,
) -> None:
    first = _pid(test_server)
    os.kill(first, signal.SIGKILL)
    _wait_until(lambda: not test_server.connected, "the provider to see the server gone")
    assert test_server.run("echo", {"text": "fresh"}, CALL_S, NO_CANCEL) == Result(content="fresh")
    assert _pid(test_server) != first


def test_a_timed_out_call_is_cancelled_on_the_server(
    test_server: McpProvider, record: Path
) -> None:
    first = _pid(test_server)
    answer = test_server.run("hang", {}, 1.0, NO_CANCEL)
    assert isinstance(answer, Failed), answer
    assert "did not answer within 1 s" in answer.message and "cancelled" in answer.message
    _wait_until(lambda: len(_notes(record)) == 2, "the server to record notifications/cancelled")
    notes = _notes(record)
    assert [n["method"] for n in notes] == ["started", "notifications/cancelled"]
    assert isinstance(notes[1]["params"]["requestId"], int)
    # The server itself was healthy (it answered the probe): same process, still working.
    assert _pid(test_server) == first


def test_a_wedged_server_is_replaced_after_the_timeout(
    make_provider: Callable[..., McpProvider],
) -> None:
    provider = make_provider([sys.executable, str(TEST_SERVER)], probe_timeout_s=1.0)
    first = _pid(provider)
    answer = provider.run("wedge", {}, 1.0, NO_CANCEL)
    assert isinstance(answer, Failed) and "did not answer within 1 s" in answer.message
    second = _pid(provider)  # waits for the probe, which fails, then starts a new server
    assert second != first
    _wait_until(lambda: _gone(first), "the wedged server to be stopped")


def test_concurrent_calls_each_get_their_own_answer(test_server: McpProvider) -> None:
    answers: dict[int, Any] = {}

    def call(i: int) -> None:
        answers[i] = test_server.run("echo", {"text": f"call {i}"}, CALL_S, NO_CANCEL)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=WAIT_S)
    assert answers == {i: Result(content=f"call {i}") for i in range(8)}


def test_close_stops_the_server_and_later_calls_fail(
    make_provider: Callable[..., McpProvider],
) -> None:
    provider = make_provider([sys.executable, str(TEST_SERVER)])
    pid = _pid(provider)
    provider.close()
    assert _gone(pid)
    assert pid not in {p.pid for p in psutil.Process().children(recursive=True) if not _gone(p.pid)}
    after = provider.run("echo", {"text": "x"}, CALL_S, NO_CANCEL)
    assert isinstance(after, Failed) and "closed" in after.message
    provider.close()  # twice is fine


# --- streamable HTTP --------------------------------------------------------------------------


@pytest.fixture
def http_server() -> Iterator[str]:
    with http_test_server() as url:
        yield url


def test_a_streamable_http_server(
    make_provider: Callable[..., McpProvider], http_server: str
) -> None:
    provider = make_provider(url=http_server)
    # a server written with the SDK speaks the 2026-07-28 stateless wire; the conformance
    # suite's servers speak 2025-11-25 (tests/mcp_conformance): both eras, one client
    assert provider.protocol_version == "2026-07-28"
    assert "echo" in {s.name for s in provider.specs()}
    over = provider.run("echo", {"text": "over http"}, CALL_S, NO_CANCEL)
    assert over == Result(content="over http")
    hung = provider.run("hang", {}, 1.0, NO_CANCEL)
    assert isinstance(hung, Failed) and "did not answer within 1 s" in hung.message
    still = provider.run("echo", {"text": "still there"}, CALL_S, NO_CANCEL)
    assert still == Result(content="still there")


def test_a_cancelled_call_is_cancelled_on_the_server(
    test_server: McpProvider, record: Path
) -> None:
    cancel = threading.Event()
    answers: list[Any] = []
    caller = threading.Thread(
        target=lambda: answers.append(test_server.run("hang", {}, 60, cancel))
    )
    caller.start()
    try:
        _wait_until(lambda: len(_notes(record)) == 1, "the hang tool to start on the server")
    finally:
        cancel.set()
        caller.join(timeout=WAIT_S)
    assert len(answers) == 1 and isinstance(answers[0], Failed), answers
    assert "cancelled" in answers[0].message
    _wait_until(lambda: len(_notes(record)) == 2, "the server to record notifications/cancelled")
    assert [n["method"] for n in _notes(record)] == ["started", "notifications/cancelled"]


# --- end to end: a real tool host process behind a real tool port ------------------------------


def _call(port: Any, tool: str, arguments: dict[str, Any], call: int = 1) -> Any:
    return port.call(session="test", call=call, tool=tool, arguments=arguments)


def test_time_tools_through_a_tool_host_and_port() -> None:
    _need("mcp_server_time")
    with mcp_port(command=TIME_SERVER, name="time") as port:
        names = {s.name for s in port.specs()}
        assert {"get_current_time", "convert_time"} <= names
        answer = _call(port, "get_current_time", {"timezone": "Europe/Paris"})
        assert isinstance(answer, Result), answer
        assert json.loads(answer.content)["timezone"] == "Europe/Paris"
        assert not answer.untrusted
        bad = _call(port, "get_current_time", {}, call=2)  # the host checks the schema
        assert isinstance(bad, Failed) and "timezone" in bad.message


def test_git_tools_through_a_tool_host_and_port(repo: Path) -> None:
    _need("mcp_server_git")
    command = [sys.executable, "-m", "mcp_server_git", "--repository", str(repo)]
    with mcp_port(command=command, name="git") as port:
        log = _call(port, "git_log", {"repo_path": str(repo)})
        assert isinstance(log, Result) and "first commit from the test" in log.content
        (repo / "new.txt").write_text("new\n")
        asked = _call(port, "git_add", {"repo_path": str(repo), "files": ["new.txt"]}, call=2)
        assert isinstance(asked, PendingApproval), asked
        assert "?? new.txt" in _status(repo)
    with mcp_port(command=command, name="git", allow=["git_add"]) as port:  # tools.allow
        added = _call(port, "git_add", {"repo_path": str(repo), "files": ["new.txt"]})
        assert isinstance(added, Result), added
        assert "A  new.txt" in _status(repo)


def test_resources_are_readable_by_the_model_through_a_tool(test_server: McpProvider) -> None:
    spec = next(s for s in test_server.specs() if s.name == "read_resource")
    assert "notes://today (today: what to do today)" in spec.description
    assert spec.untrusted and not spec.needs_approval
    answer = test_server.run("read_resource", {"uri": "notes://today"}, CALL_S, NO_CANCEL)
    assert isinstance(answer, Result) and answer.untrusted
    assert answer.content.endswith("buy milk") and "notes://today" in answer.content
    missing = test_server.run("read_resource", {"uri": "notes://nope"}, CALL_S, NO_CANCEL)
    assert isinstance(missing, Failed) and "could not read notes://nope" in missing.message


def test_tools_list_changed_reaches_the_port_and_find_tool() -> None:
    with mcp_port(command=[sys.executable, str(TEST_SERVER)]) as port:
        registry = Registry([port])
        assert registry.entry("sprout") is None
        grown = port.call(session="s", call=1, tool="grow", arguments={"name": "sprout"})
        assert isinstance(grown, Result) and grown.content == "added sprout"
        _wait_until(lambda: registry.entry("sprout") is not None, "the new tool list")
        assert "- sprout: A tool added later: sprout." in registry.find("sprout")
        answer = port.call(session="s", call=2, tool="sprout", arguments={})
        assert isinstance(answer, Result) and answer.content == "I am sprout"


def test_a_crash_mid_call_through_the_host(record: Path) -> None:
    command = [sys.executable, str(TEST_SERVER), "--record", str(record)]
    with mcp_port(command=command) as port:
        first = _call(port, "pid", {})
        crashed = _call(port, "crash", {}, call=2)
        assert isinstance(crashed, Failed) and "exited" in crashed.message, crashed
        second = _call(port, "pid", {}, call=3)
        assert isinstance(first, Result) and isinstance(second, Result), (first, second)
        assert first.content != second.content  # a new server answered


def test_a_killed_host_takes_its_wedged_mcp_server_with_it(record: Path) -> None:
    command = [sys.executable, str(TEST_SERVER), "--record", str(record)]
    with mcp_port(command=command, timeout_s=60) as port:
        pid = _call(port, "pid", {})
        assert isinstance(pid, Result), pid
        server = int(pid.content)
        answers: list[Any] = []
        caller = threading.Thread(target=lambda: answers.append(_call(port, "wedge", {}, 2)))
        caller.start()
        try:
            _wait_until(lambda: len(_notes(record)) == 1, "the wedge tool to start")
            host = port.status().pid
            assert host is not None
            os.kill(host, signal.SIGKILL)
            _wait_until(lambda: _gone(server), "the wedged MCP server to die with its host")
        finally:
            caller.join(timeout=WAIT_S)
        assert len(answers) == 1 and isinstance(answers[0], Failed), answers


def test_find_tool_and_call_tool_reach_an_mcp_server_named_in_the_config(tmp_path: Path) -> None:
    _need("mcp_server_time")
    import tomllib

    from actors.base.config import parse
    from actors.tools.registry import Local, Remote, dispatch
    from actors.tools.toolbox import Toolbox

    command = shlex.join(TIME_SERVER)
    config = parse(tomllib.loads(f"""
        [tools]
        standard = false
        workspace = {json.dumps(str(tmp_path))}
        start_timeout_s = 120  # a hang guard: an MCP server starts in seconds on a busy machine
        [[tools.hosts]]
        name = "time"
        kind = "mcp"
        command = {json.dumps(command)}
    """))
    with Toolbox.start(config) as box:
        assert not box.problems, box.problems
        found = dispatch(box.registry, "find_tool", '{"query": "current time in a timezone"}')
        assert isinstance(found, Local) and "get_current_time" in found.text, found
        call = dispatch(
            box.registry,
            "call_tool",
            '{"name": "get_current_time", "arguments": {"timezone": "America/New_York"}}',
        )
        assert isinstance(call, Remote) and call.tool == "get_current_time", call
        answer = call.port.call(session="s", call=1, tool=call.tool, arguments=call.arguments)
        assert isinstance(answer, Result), answer
        assert json.loads(answer.content)["timezone"] == "America/New_York"
