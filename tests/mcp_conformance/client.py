"""loopd's MCP client as the conformance suite runs it: ``python client.py SERVER_URL``.

The suite (``conformance client --command "python client.py" --suite all``; in the tests
forked from a warm process by warm.py) starts a server for each scenario and runs this with
its URL, the scenario's name in ``MCP_CONFORMANCE_SCENARIO`` and, for some auth scenarios,
credentials in ``MCP_CONFORMANCE_CONTEXT``. Everything MCP goes through loopd's own provider
(:class:`~actors.tools.providers.mcp.McpProvider`, as a tool host runs it): connect, list the
tools, call each one. What is scenario-specific is only what a config file would say (the
``[[tools.hosts]]`` auth keys, ``tools.elicitation``) and the person's browser, played here
by a thread that opens the authorization URL and follows its redirect to loopd's loopback
listener. Exit 0 when the tools were listed; the suite judges the rest from the server side.
The last line on stderr is ``client: exit N`` (the suite saves no exit code of its own).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from actors.base.errors import McpError
from actors.tools.providers.mcp import McpProvider
from actors.tools.providers.mcp_settings import McpAuth

# The arguments a scenario's tool expects; any other tool is called with none.
ARGUMENTS: dict[str, dict[str, Any]] = {"add_numbers": {"a": 5, "b": 3}}
CALL_S = 20.0
CIMD_URL = "https://conformance-test.local/client-metadata.json"
_SECRET_ENV = "CONFORMANCE_CLIENT_SECRET"
_KEY_ENV = "CONFORMANCE_CLIENT_KEY"


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *_: Any, **__: Any) -> None:
        return None


def browse(url: str) -> None:
    """The person's browser: the authorization server answers at once with a redirect to
    loopd's loopback listener (the suite's server approves without a login page)."""
    opener = urllib.request.build_opener(_NoRedirect)
    try:
        opener.open(url, timeout=CALL_S)
        print(f"client: {url} did not redirect", file=sys.stderr)
        return
    except urllib.error.HTTPError as e:
        location = e.headers.get("Location")
    if not location:
        print(f"client: no redirect from {url}", file=sys.stderr)
        return
    with urllib.request.urlopen(location, timeout=CALL_S) as page:  # loopd's listener
        page.read()


def auth_for(scenario: str, context: dict[str, Any]) -> McpAuth:
    """What a person would write in [[tools.hosts]] for this scenario's server."""
    if not scenario.startswith("auth/"):
        return McpAuth()
    client_id = str(context.get("client_id") or "")
    secret = context.get("client_secret")
    if secret:
        os.environ[_SECRET_ENV] = str(secret)  # config names the variable, never the secret
    secret_ref = f"env:{_SECRET_ENV}" if secret else ""
    if scenario.startswith("auth/client-credentials"):
        key = context.get("private_key_pem")
        if key:
            os.environ[_KEY_ENV] = str(key)
        return McpAuth(oauth="client_credentials", client_id=client_id, client_secret=secret_ref,
                       private_key=f"env:{_KEY_ENV}" if key else "",
                       signing_algorithm=str(context.get("signing_algorithm") or "ES256"))
    return McpAuth(oauth="authorization_code", client_id=client_id, client_secret=secret_ref,
                   client_metadata_url=CIMD_URL, authorize_timeout_s=CALL_S)


def main(argv: list[str]) -> int:
    url = argv[-1]
    scenario = os.environ.get("MCP_CONFORMANCE_SCENARIO", "")
    context = json.loads(os.environ.get("MCP_CONFORMANCE_CONTEXT") or "{}")

    def on_authorize(address: str) -> None:
        threading.Thread(target=browse, args=(address,), daemon=True).start()

    try:
        provider = McpProvider(url=url, auth=auth_for(scenario, context), elicitation="defaults",
                               on_authorize=on_authorize, connect_timeout_s=CALL_S)
    except McpError as e:
        print(f"client: {e}", file=sys.stderr)
        return 1
    print(f"client: protocol {provider.protocol_version}", file=sys.stderr, flush=True)
    no_cancel = threading.Event()
    with provider:
        for spec in provider.specs():
            answer = provider.run(spec.name, ARGUMENTS.get(spec.name, {}), CALL_S, no_cancel)
            print(f"client: {spec.name} -> {answer!r}"[:400], file=sys.stderr)
    return 0


def run(argv: list[str]) -> int:
    """main, and its exit code said last (the suite saves none when it runs them all)."""
    code = 1
    try:
        code = main(argv)
    finally:
        print(f"client: exit {code}", file=sys.stderr, flush=True)
    return code


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
