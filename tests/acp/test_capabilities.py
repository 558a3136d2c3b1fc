"""``initialize`` declares exactly what ``loopd acp`` answers: every session capability it
declares has its method routed (an unknown session gets an answer other than "method not
found"), and the methods it leaves undeclared are not there."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.support.acp_editor import AcpEnv, RawAgent

pytestmark = pytest.mark.timeout(120)

METHODS = {  # a session capability -> its method and the params of a call on no session
    "list": ("session/list", {}),
    "fork": ("session/fork", {"sessionId": "nobody", "cwd": "", "mcpServers": []}),
    "resume": ("session/resume", {"sessionId": "nobody", "cwd": "", "mcpServers": []}),
    "close": ("session/close", {"sessionId": "nobody"}),
    "delete": ("session/delete", {"sessionId": "nobody"}),
}
UNDECLARED = [("session/set_mode", {"sessionId": "nobody", "modeId": "x"}),
              ("authenticate", {"methodId": "x"}),
              ("session/set_config_option", {"sessionId": "nobody", "configId": "x",
                                             "value": "y"})]  # fmt: skip


def test_initialize_declares_what_is_routed_and_nothing_else(
    env: AcpEnv, raw: Callable[..., RawAgent]
) -> None:
    agent = raw("--local")
    init = agent.request("initialize", {"protocolVersion": 1})["result"]
    capabilities = init["agentCapabilities"]
    assert capabilities["loadSession"] is True
    assert capabilities["mcpCapabilities"] == {"http": True, "sse": False, "acp": False}
    assert capabilities["promptCapabilities"] == {"image": False, "audio": False,
                                                  "embeddedContext": False}
    assert init["authMethods"] == []
    declared = capabilities["sessionCapabilities"]
    assert sorted(declared) == sorted(METHODS), declared
    for name in declared:
        method, params = METHODS[name]
        if "cwd" in params:
            params = {**params, "cwd": str(env.workspace)}
        answer = agent.request(method, params)
        assert answer.get("error", {}).get("code") != -32601, (name, answer)
    for method, params in UNDECLARED:
        assert agent.request(method, params)["error"]["code"] == -32601, method
    assert agent.close() == 0
