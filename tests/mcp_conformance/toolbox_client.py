"""loopd's whole tool side against a conformance scenario's authorization server.

``python toolbox_client.py SERVER_URL``, run by the suite like client.py, but the way
``loopd run`` does it: a config with the server as an ``[[tools.hosts]]`` entry (``oauth =
"authorization_code"``), :class:`~actors.tools.toolbox.Toolbox` starting the standard hosts
and the MCP tool host, the authorization URL reaching ``on_authorize`` (the person's
browser, played by client.browse) from the host's stderr, the token kept in loopd's data
directory. Then it checks what the person must be able to rely on, and says each check on
stderr; the last line is ``toolbox client: all checks passed`` or the exit code is 1:

- the tool of the scenario's server answers through the tool host;
- the authorization URL came once, with PKCE and the resource parameter;
- the token file is mode 0600 (its directory 0700) and holds the token;
- run_command (in its sandbox) cannot read it, while it can read the workspace.
"""

from __future__ import annotations

import shutil
import stat
import sys
import tempfile
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from client import browse

from actors.base.config import Config, HostConfig
from actors.tools.protocol import wire
from actors.tools.toolbox import Toolbox, token_file


def check(ok: bool, what: str) -> None:
    print(f"toolbox client: {'ok' if ok else 'FAILED'}: {what}", file=sys.stderr, flush=True)
    if not ok:
        raise SystemExit(1)


def main(url: str) -> int:
    # Not under the temporary directory, which the sandbox hides as a whole: the data
    # directory must be what hides the token.
    home = Path(tempfile.mkdtemp(prefix=".oauth-", dir=Path(__file__).parent))
    try:
        workspace = home / "ws"
        workspace.mkdir()
        (workspace / "notes.txt").write_text("in the workspace\n")
        host = HostConfig(name="remote", kind="mcp", url=url, oauth="authorization_code",
                          oauth_timeout_s=60)
        config = (Config()
                  .replace("embedded", data_dir=str(home / "data"))
                  .replace("tools", workspace=str(workspace), hosts=(host,), start_timeout_s=90,
                           allow=("run_command",)))
        asked: list[str] = []

        def on_authorize(name: str, address: str) -> None:
            asked.append(address)
            threading.Thread(target=browse, args=(address,), daemon=True).start()

        with Toolbox.start(config, on_authorize=on_authorize) as box:
            check(box.problems == {}, f"every host came up: {box.problems}")
            remote = [s for s in box.registry.specs() if box.registry.entry(s.name)
                      and box.registry.entry(s.name)[1].name == "remote"]  # type: ignore[index]
            check(bool(remote), "the server's tools are offered")
            entry = box.registry.entry(remote[0].name)
            assert entry is not None
            answer = entry[1].call(session="s", call=1, tool=box.registry.host_name(remote[0].name),
                                   arguments={}, approved=True)
            check(isinstance(answer, wire.Result), f"{remote[0].name} answered: {answer!r}")
            check(len(asked) == 1 and "code_challenge=" in asked[0] and "resource=" in asked[0],
                  f"the authorization URL came once, with PKCE and resource: {asked}")
            path = token_file(config, "remote")
            check(path.exists() and stat.S_IMODE(path.stat().st_mode) == 0o600,
                  f"the token file {path} is 0600")
            check(stat.S_IMODE(path.parent.stat().st_mode) == 0o700, "its directory is 0700")
            check('"access_token"' in path.read_text(), "it holds the access token")
            shell = box.registry.entry("run_command")
            assert shell is not None
            seen = shell[1].call(session="s", call=2, tool="run_command",
                                 arguments={"command": f"cat notes.txt; cat {path}"},
                                 approved=True)
            text = seen.content if isinstance(seen, wire.Result) else repr(seen)
            check("in the workspace" in text, f"run_command runs in the workspace: {text[:300]}")
            check("access_token" not in text and "No such file" in text,
                  f"run_command cannot see the token file: {text[:300]}")
    finally:
        shutil.rmtree(home, ignore_errors=True)
    print("toolbox client: all checks passed", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[-1]))
