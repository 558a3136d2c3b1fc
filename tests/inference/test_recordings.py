"""Every real llama-server recording, replayed through the client; and the .http format.

Expected values come from reading each recording's events directly (a few lines of
independent parsing), plus the facts its README states.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors.base.errors import RecordingError
from actors.base.events import Content, Progress, Retrying, ToolCallDelta
from actors.inference.types import Completion, InferError, InferErrorKind, is_context_full
from scripts import record
from tests.support import recording
from tests.support.fake_llama import FakeLlama, answer, replay
from tests.support.inference_rig import MakeRig, request
from tests.support.recordings import FIXTURES

FILES = sorted(p.name for p in FIXTURES.glob("*.http"))


def test_the_recordings_are_in_the_repository_byte_for_byte() -> None:
    """The copies must stay exact: SHA256SUMS holds the digests of the recordings as made."""
    sums = (FIXTURES / "SHA256SUMS").read_text().split("\n")
    listed = dict(reversed(line.split("  ", 1)) for line in sums if line)
    assert set(listed) == {*FILES, "README.md"}
    for name, digest in listed.items():
        assert hashlib.sha256((FIXTURES / name).read_bytes()).hexdigest() == digest, name


def reference(body: bytes) -> dict[str, Any]:
    """What an SSE body says, read the plain way: data lines, JSON, concatenation."""
    out: dict[str, Any] = {"content": "", "reasoning": "", "args": {}, "names": {},
                           "finish": None, "usage": None, "progress": 0, "error": None,
                           "done": False}
    for line in body.decode().split("\n"):
        if not line.startswith("data: "):
            continue
        data = line[len("data: "):]
        if data == "[DONE]":
            out["done"] = True
            continue
        obj = json.loads(data)
        if "error" in obj:
            out["error"] = obj["error"]
            continue
        if "prompt_progress" in obj:
            out["progress"] += 1
            continue
        out["usage"] = obj.get("usage") or out["usage"]
        for choice in obj.get("choices", []):
            d = choice.get("delta", {})
            out["content"] += d.get("content") or ""
            out["reasoning"] += d.get("reasoning_content") or ""
            for f in d.get("tool_calls") or []:
                fn = f.get("function", {})
                out["args"][f["index"]] = out["args"].get(f["index"], "") + fn.get("arguments", "")
                if fn.get("name"):
                    out["names"][f["index"]] = fn["name"]
            out["finish"] = choice.get("finish_reason") or out["finish"]
    return out


@pytest.mark.parametrize("name", FILES)
def test_recording_round_trips_byte_for_byte(name: str) -> None:
    data = (FIXTURES / name).read_bytes()
    exchanges = recording.parse(data)
    assert recording.dump(exchanges) == data
    for ex in exchanges:
        assert ex.request.method == "POST" and ex.request.json()["messages"]


@pytest.mark.parametrize("name", FILES)
def test_each_recording_replayed_through_the_client(rig: MakeRig, name: str) -> None:
    exchanges = recording.load(FIXTURES / name)
    r = rig(replay(FIXTURES / name), retries=0)
    for ex in exchanges:
        ref = reference(ex.response.body)
        if ex.response.status != 200:
            with pytest.raises(InferError) as e:
                r.chat()
            assert (e.value.kind, e.value.status) == (InferErrorKind.HTTP, ex.response.status)
            assert e.value.error_body() == json.loads(ex.response.body)["error"]
            continue
        if ref["error"] is not None:
            with pytest.raises(InferError) as e:
                r.chat()
            assert e.value.status == ref["error"]["code"]
            assert ref["error"]["message"] in e.value.message
            continue
        done = r.chat()
        assert ref["done"]
        assert (done.content or "") == ref["content"]
        assert (done.reasoning or "") == ref["reasoning"]
        order = sorted(ref["args"])
        assert [c.arguments for c in done.tool_calls] == [ref["args"][i] for i in order]
        assert [c.name for c in done.tool_calls] == [ref["names"][i] for i in order]
        assert done.finish_reason == ref["finish"]
        assert dict(done.usage) == ref["usage"]
        assert sum(isinstance(e, Progress) for e in r.events) == ref["progress"]
    assert len(r.fake.requests) == len(exchanges)


def replay_all(rig: MakeRig, name: str) -> list[Completion]:
    r = rig(replay(FIXTURES / name), retries=0)
    return [r.chat() for _ in recording.load(FIXTURES / name)]


def test_text_shows_progress_in_several_chunks_and_usage_at_the_end(rig: MakeRig) -> None:
    r = rig(replay(FIXTURES / "text.http"))
    done = r.chat()
    progress = [e for e in r.events if isinstance(e, Progress)]
    assert len(progress) == 3 and progress[-1].processed == progress[-1].total == 3278
    assert progress[0].cache == done.timings["cache_n"] == 3
    assert done.usage["prompt_tokens"] == done.timings["prompt_n"] + done.timings["cache_n"]
    assert done.content and done.finish_reason == "stop"


@pytest.mark.parametrize("name,tool", [("find_tool.http", "find_tool"),
                                       ("call_tool.http", "call_tool")])
def test_tool_call_recordings_give_one_parseable_call(rig: MakeRig, name: str, tool: str) -> None:
    r = rig(replay(FIXTURES / name))
    done = r.chat()
    (call,) = done.tool_calls
    assert call.name == tool and len(call.id) == 32 and done.finish_reason == "tool_calls"
    assert isinstance(json.loads(call.arguments), dict)
    assert sum(isinstance(e, ToolCallDelta) for e in r.events) > 3  # fragments, not one blob


def test_tool_session_reuses_the_cache(rig: MakeRig) -> None:
    first, second, third = replay_all(rig, "tool_session.http")
    assert [c.name for c in first.tool_calls + second.tool_calls] == ["find_tool", "call_tool"]
    assert third.finish_reason in ("stop", "length")
    for before, after in ((first, second), (second, third)):
        assert after.timings["cache_n"] >= before.prompt_tokens - 16


def test_cache_loss_shows_the_drop(rig: MakeRig) -> None:
    first, second = replay_all(rig, "cache_loss.http")
    assert first.timings["cache_n"] > first.prompt_tokens // 2
    assert second.timings["cache_n"] < first.prompt_tokens // 10


def test_length_keeps_finish_reason_length(rig: MakeRig) -> None:
    (done,) = replay_all(rig, "length.http")
    assert done.finish_reason == "length" and done.tool_calls == ()
    assert done.content is not None and done.content.startswith('{"name')  # a call as JSON text


def test_model_output_error_is_retried_and_its_partial_call_dropped(rig: MakeRig) -> None:
    r = rig([*replay(FIXTURES / "model_output_error.http"), answer("Here are the files.")])
    done = r.chat()
    (retry,) = [e for e in r.events if isinstance(e, Retrying)]
    assert "HTTP 500" in retry.reason
    assert done.tool_calls == () and done.content == "Here are the files."
    kinds = [type(e).__name__ for e in r.events]
    assert "ToolCallDelta" in kinds[: kinds.index("Retrying")]  # shown, then dropped
    assert "".join(e.text for e in r.events if isinstance(e, Content)) == done.content


def test_context_full_recording_is_context_full(rig: MakeRig) -> None:
    r = rig(replay(FIXTURES / "context_full.http"))
    with pytest.raises(InferError) as e:
        r.chat()
    assert is_context_full(e.value)


def test_loading_recording_is_a_retryable_503(rig: MakeRig) -> None:
    r = rig([*replay(FIXTURES / "loading.http"), *replay(FIXTURES / "text.http")])
    done = r.chat()
    assert done.content and [e.reason for e in r.events if isinstance(e, Retrying)] == [
        "HTTP 503: Loading model"
    ]


# --- the format, and scripts/record.py ---------------------------------------------------------

header = st.tuples(st.sampled_from(["Content-Type", "X-A"]), st.text("abc/;= -", max_size=12)
                   .map(str.strip))
sse_body = st.lists(st.text(max_size=30).map(lambda t: f"data: {json.dumps(t)}\n\n"), max_size=5)


@given(
    exchanges=st.lists(
        st.builds(
            recording.Exchange,
            st.builds(recording.Request, st.just("POST"), st.just("/v1/chat/completions"),
                      st.lists(header, max_size=2).map(tuple),
                      st.dictionaries(st.text(max_size=5), st.text(max_size=9))
                      .map(lambda d: json.dumps(d).encode())),
            st.builds(recording.Response, st.sampled_from([200, 400, 503]),
                      st.sampled_from(["OK", "Bad Request", "Service Unavailable"]),
                      st.lists(header, max_size=2).map(tuple),
                      sse_body.map(lambda b: "".join(b).encode())),
        ),
        min_size=1, max_size=3,
    )
)
def test_dump_then_parse_gives_the_same_exchanges(exchanges: list[recording.Exchange]) -> None:
    assert recording.parse(recording.dump(exchanges)) == exchanges


@pytest.mark.parametrize("bad,why", [
    (b"POST / HTTP/1.1\n\n{}\n", "must start with"),
    (b"### request\nPOST / HTTP/1.1\n\n{}\n", "no '### response'"),
    (b"### request\nPOST / HTTP/1.1\n\n{}\n### response\nHTTP/1.1 OK\n\nx", "bad status line"),
    (b"### request\nPOST / HTTP/1.1\nno colon\n\n{}\n### response\nHTTP/1.1 200 OK\n\n", "header"),
])
def test_a_bad_recording_names_the_problem(tmp_path: Path, bad: bytes, why: str) -> None:
    path = tmp_path / "bad.http"
    path.write_bytes(bad)
    with pytest.raises(RecordingError, match=why) as e:
        recording.load(path)
    assert str(path) in str(e.value)


def test_record_script_writes_what_the_client_then_replays(rig: MakeRig, tmp_path: Path) -> None:
    body = {"messages": [{"role": "user", "content": "Hi"}], "stream": True,
            "stream_options": {"include_usage": True}, "return_progress": True}
    req = tmp_path / "req.json"
    req.write_text(json.dumps(body, indent=2))
    out = tmp_path / "out.http"
    with FakeLlama([answer("Recorded answer.", tool_calls=[("find_tool", '{"q": 1}')]),
                    answer("Second.")]) as fake:
        assert record.main([fake.url, str(req), str(out)]) == 0
        assert record.main([fake.url, str(req), str(out), "--append"]) == 0
        assert fake.requests == [body, body]
    exchanges = recording.load(out)
    assert len(exchanges) == 2 and exchanges[0].request.json() == body
    assert exchanges[0].response.content_type == "text/event-stream"
    assert exchanges[0].response.body.endswith(b"data: [DONE]\n\n")
    r = rig(replay(out))
    first = r.chat(request())
    assert first.content == "Recorded answer." and first.tool_calls[0].name == "find_tool"
    assert r.chat(request()).content == "Second."


def test_record_script_refuses_a_bad_request_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    req = tmp_path / "req.json"
    req.write_text("{not json")
    assert record.main(["http://127.0.0.1:9", str(req), str(tmp_path / "o.http")]) == 2
    assert "cannot read a JSON body" in capsys.readouterr().err
