"""The stream assembler: tool calls from fragments split anywhere, and fuzzing the parser.

The fuzz tests feed arbitrary bytes (and arbitrary JSON in SSE framing) through the whole
client over a handler (tests/support/http_backend.py): the only exception allowed out is InferError.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors.base.cancel import CancelToken
from actors.base.events import Progress, ToolCallDelta
from actors.inference.llama import LlamaClient
from actors.inference.sse import StreamAssembler
from actors.inference.types import InferError, InferErrorKind
from actors.log.records import ToolCall
from tests.support.http_backend import HandlerBackend
from tests.support.inference_rig import config, request


def chunk(delta: dict[str, Any], **extra: Any) -> str:
    return json.dumps({"id": "chatcmpl-t", "choices": [{"index": 0, "delta": delta}], **extra})


def frag(index: int, args: str, *, id: str | None = None, name: str | None = None) -> str:
    fn: dict[str, Any] = {"arguments": args}
    f: dict[str, Any] = {"index": index, "function": fn}
    if id is not None:
        f["id"] = id
    if name is not None:
        fn["name"] = name
    return chunk({"tool_calls": [f]})


def finish(asm: StreamAssembler, reason: str = "tool_calls") -> None:
    asm.feed(json.dumps({"choices": [{"index": 0, "delta": {}, "finish_reason": reason}]}))
    asm.feed("[DONE]")


def test_a_later_name_replaces_and_arguments_append() -> None:
    asm = StreamAssembler()
    events = [
        *asm.feed(frag(0, "{", id="a1", name="find")),
        *asm.feed(frag(0, '"q": 1')),
        *asm.feed(frag(0, "}", name="find_tool")),  # a changed name arrives in full
    ]
    finish(asm)
    assert asm.completion().tool_calls == (ToolCall("a1", "find_tool", '{"q": 1}'),)
    assert events == [
        ToolCallDelta(0, "a1", "find", "{"),
        ToolCallDelta(0, None, None, '"q": 1'),
        ToolCallDelta(0, None, "find_tool", "}"),
    ]


def test_progress_chunk_role_delta_is_not_content() -> None:
    asm = StreamAssembler()
    role = {"role": "assistant", "content": None}
    progress = {"total": 10, "cache": 2, "processed": 2, "time_ms": 0}
    assert asm.feed(chunk(role, prompt_progress=progress)) == [Progress(2, 10, 2)]
    assert asm.feed(chunk(role)) == []
    finish(asm, "stop")
    done = asm.completion()
    assert (done.content, done.reasoning, done.tool_calls) == (None, None, ())


def test_an_answer_cut_before_its_timings_says_what_its_progress_did() -> None:
    """A stream loopd closed (runaway text, a timeout) never gets the server's timings: the
    tokens processed are the prompt less what its cache held, as the progress said (the
    eval counted the whole prompt: ~3,000 tokens too many per cut turn on a long chat)."""
    asm = StreamAssembler()
    progress = {"total": 4000, "cache": 3100, "processed": 4000, "time_ms": 0}
    asm.feed(chunk({"role": "assistant", "content": None}, prompt_progress=progress))
    asm.feed(chunk({"content": "The Pallets"}))
    asm.cut_short("echo", "answer cut")
    usage = asm.completion().usage_record()
    assert (usage.prompt_tokens, usage.timings) == (4000, {"prompt_n": 900, "cache_n": 3100})


def test_usage_and_timings_are_kept_whole() -> None:
    asm = StreamAssembler()
    usage = {"prompt_tokens": 5, "completion_tokens": 2,
             "completion_tokens_details": {"reasoning_tokens": 7}}
    timings = {"cache_n": 3, "prompt_n": 2, "draft_n": 1}
    asm.feed(chunk({"reasoning_content": "hm"}))
    asm.feed(json.dumps({"choices": [], "usage": usage, "timings": timings}))
    asm.feed("[DONE]")
    done = asm.completion()
    assert done.usage == usage and done.timings == timings
    assert done.reasoning_tokens == 7  # the server's count wins over the deltas seen


def test_data_after_done_is_refused() -> None:
    asm = StreamAssembler()
    asm.feed("[DONE]")
    with pytest.raises(InferError) as e:
        asm.feed(chunk({"content": "late"}))
    assert e.value.kind is InferErrorKind.PROTOCOL


def test_a_call_without_a_name_is_a_protocol_error() -> None:
    asm = StreamAssembler()
    asm.feed(frag(0, "{}", id="x"))
    finish(asm)
    with pytest.raises(InferError, match="without a name"):
        asm.completion()


calls_strategy = st.lists(
    st.tuples(
        st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=12),
        st.dictionaries(st.text(max_size=8), st.one_of(st.integers(), st.text(max_size=20)),
                        max_size=4),
    ),
    min_size=1,
    max_size=4,
)


@given(calls=calls_strategy, data=st.data())
def test_tool_calls_assemble_from_fragments_split_anywhere(
    calls: list[tuple[str, dict[str, Any]]], data: st.DataObject
) -> None:
    """Arguments cut at any points, calls interleaved in any order: same calls come out."""
    wanted = [
        ToolCall(f"id{i}", name, json.dumps(args, ensure_ascii=False))
        for i, (name, args) in enumerate(calls)
    ]
    queues: list[list[str]] = []
    for i, call in enumerate(wanted):
        text = call.arguments
        cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(text) - 1)), max_size=6)))
        pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        pieces = [p for p in pieces if p] or [""]
        first = frag(i, pieces[0], id=call.id, name=call.name)
        queues.append([first, *(frag(i, p) for p in pieces[1:])])
    asm = StreamAssembler()
    while any(queues):
        pick = data.draw(st.sampled_from([q for q in queues if q]))
        asm.feed(pick.pop(0))
    finish(asm)
    assert asm.completion().tool_calls == tuple(wanted)


# --- fuzz: nothing but InferError out of the client ------------------------------------------


def run_body(chunks: list[bytes]) -> None:
    def handler(req: httpx.Request) -> httpx.Response:
        def stream() -> Iterator[bytes]:
            yield from chunks

        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=stream())

    client = LlamaClient(config("http://fake", retries=0), network=HandlerBackend(handler))
    try:
        client.chat_with_retry(request(thinking_budget=2), lambda e: None, CancelToken())
    except InferError:
        pass
    finally:
        client.close()


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True) if a < b]


@given(body=st.binary(max_size=2000), cuts=st.lists(st.integers(0, 4000), max_size=8))
def test_arbitrary_bytes_give_only_inferror(body: bytes, cuts: list[int]) -> None:
    run_body(split(body, cuts))


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["choices", "delta", "content", "reasoning_content", "tool_calls",
                         "index", "id", "function", "name", "arguments", "finish_reason",
                         "usage", "timings", "prompt_progress", "error", "processed", "x"]),
        inner, max_size=4),
    max_leaves=20,
)


def either(good: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly the right type (7 in 8), sometimes any JSON at all."""
    return st.one_of(*[good] * 7, json_values)


def optional_keys(**fields: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries({}, optional=fields)


fragment = optional_keys(
    index=either(st.integers(-1, 3)),
    id=either(st.text(max_size=4)),
    type=st.just("function"),
    function=either(optional_keys(name=either(st.text(max_size=6)),
                                  arguments=either(st.text(max_size=6)))),
)
delta = optional_keys(
    role=st.just("assistant"),
    content=either(st.text(max_size=6) | st.none()),
    reasoning_content=either(st.text(max_size=6)),
    tool_calls=either(st.lists(fragment, max_size=2)),
)
choice = optional_keys(index=st.just(0), delta=either(delta),
                       finish_reason=either(st.sampled_from(["stop", "length", "tool_calls"])))
shaped_chunk = optional_keys(
    id=either(st.text(max_size=6)),
    choices=either(st.lists(either(choice), max_size=2)),
    prompt_progress=either(optional_keys(processed=either(st.integers()),
                                         total=either(st.integers()),
                                         cache=either(st.integers()))),
    usage=either(optional_keys(completion_tokens_details=either(
        optional_keys(reasoning_tokens=either(st.integers()))))),
    timings=json_values,
)  # no "error" key: it ends a stream at once, and json_values already makes some


@given(
    objs=st.lists(st.one_of(json_values, shaped_chunk, shaped_chunk), max_size=12),
    done=st.booleans(),
    cuts=st.lists(st.integers(0, 4000), max_size=8),
)
def test_arbitrary_json_in_sse_framing_gives_only_inferror(
    objs: list[Any], done: bool, cuts: list[int]
) -> None:
    lines = [f"data: {json.dumps(o)}\n\n" for o in objs] + (["data: [DONE]\n\n"] if done else [])
    run_body(split("".join(lines).encode(), cuts))
