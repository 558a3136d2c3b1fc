"""The fake llama-server itself: its prompt cache, its script, and its own-process mode."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.fake_llama import FakeLlama, Reply, answer, render_prompt
from tests.support.inference_rig import USER, MakeRig, request
from tests.support.recordings import FIXTURES

ROOT = Path(__file__).resolve().parents[2]


def test_a_growing_conversation_hits_the_cache_and_an_edit_loses_it(rig: MakeRig) -> None:
    r = rig(lambda body: answer("Sure, here it is.", reasoning="Easy.",
                                tool_calls=[("c1", "find_tool", '{"q": "x"}')]))
    first = r.chat()
    grown = (*USER,
             {"role": "assistant", "content": "Sure, here it is.", "reasoning_content": "Easy.",
              "tool_calls": [{"id": "c1", "type": "function",
                              "function": {"name": "find_tool", "arguments": '{"q": "x"}'}}]},
             {"role": "tool", "tool_call_id": "c1", "content": "result"})
    second = r.chat(request(messages=grown))
    # the whole previous prompt and what was generated for it are reused
    assert second.timings["cache_n"] >= first.prompt_tokens + first.completion_tokens - 2
    edited = ({"role": "system", "content": "Changed."}, *grown[1:])
    third = r.chat(request(messages=edited))
    assert third.timings["cache_n"] < 10
    other_slot = r.chat(request(messages=grown), slot=1)
    assert other_slot.timings["cache_n"] == 0  # slots keep their own cache


def test_render_prompt_is_stable_and_grows_by_appending() -> None:
    body = {"messages": list(USER), "tools": [{"type": "function"}]}
    longer = {**body, "messages": [*USER, {"role": "user", "content": "again"}]}
    assert render_prompt(body) == render_prompt(dict(body))
    assert render_prompt(longer).startswith(render_prompt(body)[: -len("<|assistant|>")])


def test_a_callable_script_sees_each_body() -> None:
    seen = []

    def script(body: dict[str, Any]) -> Reply:
        seen.append(body["messages"][-1]["content"])
        return answer(f"echo {len(seen)}")

    with FakeLlama(script) as fake:
        for _ in range(2):
            r = httpx.post(fake.url + "/v1/chat/completions",
                           json={"messages": [{"role": "user", "content": "ping"}], "stream": True})
            assert r.status_code == 200 and "echo" in r.text
    assert seen == ["ping", "ping"]


def test_health_unknown_routes_bad_json_and_unknown_control_ids() -> None:
    with FakeLlama([]) as fake:
        assert httpx.get(fake.url + "/health").json() == {"status": "ok"}
        assert httpx.get(fake.url + "/nope").status_code == 404
        bad = httpx.post(fake.url + "/v1/chat/completions", content=b"{oops")
        assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"
        ctl = httpx.post(fake.url + "/v1/chat/completions/control",
                         json={"id": "chatcmpl-unknown", "action": "reasoning_end"})
        assert ctl.status_code == 404 and fake.control_calls == [
            {"id": "chatcmpl-unknown", "action": "reasoning_end"}
        ]


def test_close_ends_idle_keep_alive_connections() -> None:
    fake = FakeLlama([answer("a")]).start()
    client = httpx.Client()
    try:
        client.post(fake.url + "/v1/chat/completions", json={"messages": [], "stream": True})
    finally:
        fake.close()  # must not wait for the client to close its pooled connection
        client.close()
    assert fake.stopping.is_set()


@pytest.mark.skipif(not FIXTURES.is_dir(), reason="no recordings")
def test_runs_in_its_own_process_and_replays_in_a_cycle() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support.fake_llama", "--port", "0",
         "--replay", str(FIXTURES / "text.http"), "--cycle"],
        cwd=ROOT, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:")
        for _ in range(3):
            text = httpx.post(url + "/v1/chat/completions", json={"messages": []}).text
            assert text.endswith("data: [DONE]\n\n")
    finally:
        proc.terminate()
        assert proc.wait(timeout=20) == 0
