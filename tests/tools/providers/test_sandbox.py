"""Sandbox's own rules: the environment it passes, the bwrap command line, and its checks.

The promises, attacked through a real tool host, are in tests/faults/test_sandbox.py; the
two tests at the end here run bwrap itself (skipped where it cannot run).
"""

from __future__ import annotations

import dataclasses
import os
import resource
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from actors.base.config import DEFAULT_ENV, ShellConfig
from actors.tools.providers.command import run_shell
from actors.tools.providers.pidgroup import CommandGroup
from actors.tools.providers.sandbox import Bounds, Sandbox

SOURCE = {
    "PATH": "/usr/bin:/bin", "HOME": "/home/me", "LANG": "C.UTF-8", "LC_TIME": "C",
    "OPENAI_API_KEY": "sk-secret", "PYTHONPATH": "/x", "TMPDIR": "/var/tmp/me",
}  # fmt: skip
WS = Path("/w/ws")
PRIVATE = ("/tmp", "/run", "/dev/shm", "/var/run")


def test_the_environment_is_the_allow_list() -> None:
    env = Sandbox().environment(SOURCE)
    assert env == {
        "PATH": "/usr/bin:/bin", "HOME": "/home/me", "LANG": "C.UTF-8", "LC_TIME": "C",
        "TMPDIR": "/tmp",  # the private one, not the host's
    }  # fmt: skip
    plain = Sandbox("none").environment(SOURCE)  # the same allow-list without a sandbox
    assert "OPENAI_API_KEY" not in plain
    assert "TMPDIR" not in plain  # not allowed, and no private /tmp to point at
    assert Sandbox(env=("HOME",)).environment({"HOME": "/h"}) == {
        "HOME": "/h", "PATH": os.defpath, "TMPDIR": "/tmp",
    }  # fmt: skip  # a command always has a PATH
    assert "LC_*" in DEFAULT_ENV


def test_without_a_sandbox_the_command_line_is_the_shell() -> None:
    assert Sandbox("none").argv("", "echo hi", WS) == ["/bin/sh", "-c", "echo hi"]


def _pairs(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == flag]


def test_the_bwrap_command_line() -> None:
    argv = Sandbox().argv("/usr/bin/bwrap", "echo hi", WS)
    assert argv[:5] == ["/usr/bin/bwrap", "--ro-bind", "/", "/", "--dev"]
    assert argv[-4:] == ["--", "/bin/sh", "-c", "echo hi"]
    assert ["--bind", str(WS), str(WS)] == argv[argv.index("--bind") : argv.index("--bind") + 3]
    assert {"/tmp", "/run"} <= set(_pairs(argv, "--tmpfs"))
    assert "/proc/sys" in _pairs(argv, "--ro-bind")
    for flag in ("--unshare-all", "--die-with-parent", "--new-session"):
        assert flag in argv
    assert "--share-net" not in argv
    assert _pairs(argv, "--chdir") == [str(WS)]
    assert "--share-net" in Sandbox(network=True).argv("bwrap", "x", WS)


@pytest.fixture
def var_tmp() -> Iterator[Path]:
    """A directory outside /tmp (which the sandbox makes fresh anyway)."""
    path = Path(tempfile.mkdtemp(prefix="loopd-test-", dir="/var/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path)


def test_hidden_places_around_and_inside_the_workspace(var_tmp: Path) -> None:
    ws = var_tmp / "ws"
    for d in (ws / "run" / "deeper", var_tmp / "logs", Path(tempfile.gettempdir())):
        d.mkdir(parents=True, exist_ok=True)
    (ws / "rules.toml").write_text("")
    (var_tmp / "key_secret").write_text("")
    hide = (str(var_tmp), str(ws / "run"), str(ws / "run" / "deeper"), str(ws),
            str(var_tmp / "logs"), str(ws / "rules.toml"), str(var_tmp / "key_secret"),
            str(var_tmp / "not-there"), "/tmp/x", tempfile.gettempdir())
    argv = Sandbox(hide=hide).argv("bwrap", "x", ws)
    bind = argv.index("--bind")
    tmpfs = [i for i, a in enumerate(argv) if a == "--tmpfs"]
    around = [argv[i + 1] for i in tmpfs if i < bind and argv[i + 1] not in PRIVATE]
    inside = [argv[i + 1] for i in tmpfs if i > bind]
    assert around == [str(var_tmp)]  # emptied first, the workspace bound into it; its
    assert "--remount-ro" in argv[bind:]  # logs need nothing more: they are under it
    assert argv[argv.index(str(var_tmp), bind) - 1] == "--remount-ro"  # then locked
    assert inside == [str(ws / "run")]  # deeper is under it
    assert _pairs(argv, "--ro-bind").count("/dev/null") == 1  # the rules file, in the ws
    assert argv[argv.index(str(ws / "rules.toml")) - 1] == "/dev/null"
    assert str(ws) not in around + inside  # the workspace itself is never hidden
    assert all(not p.startswith("/tmp") for p in around + inside)  # fresh already


def test_a_config_kept_at_the_top_stays_hidden(var_tmp: Path) -> None:
    """loopd's config kept as the workspace's loopd.toml is hidden (an inference.api_key
    may be in it), not bound back read-only over the empty file."""
    ws = var_tmp / "ws"
    ws.mkdir()
    (ws / "loopd.toml").write_text('[inference]\napi_key = "sk-secret"\n')
    argv = Sandbox(hide=(str(ws / "loopd.toml"),)).argv("bwrap", "x", ws)
    binds = [argv[i + 1 : i + 3] for i, a in enumerate(argv) if a == "--ro-bind"]
    assert [["/dev/null", str(ws / "loopd.toml")]] == [b for b in binds if b[1].endswith(".toml")]


def test_without_bwrap_the_check_says_how_to_install_it(tmp_path: Path) -> None:
    why = Sandbox().check({"PATH": str(tmp_path)}, tmp_path)
    assert f"bwrap is not on the PATH ({tmp_path})" in why
    assert "apt-get install bubblewrap" in why
    assert 'tools.shell.sandbox = "none"' in why
    assert Sandbox("none").check({"PATH": str(tmp_path)}, tmp_path) == ""


def test_a_bwrap_that_cannot_sandbox_is_explained(tmp_path: Path) -> None:
    fake = tmp_path / "bin" / "bwrap"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2; exit 1\n")
    fake.chmod(0o755)
    why = Sandbox().check({"PATH": str(fake.parent)}, tmp_path)
    assert "cannot make its sandbox here: bwrap: No permissions to create new namespace" in why
    assert "kernel.unprivileged_userns_clone" in why


def _real() -> Sandbox:
    sandbox = Sandbox()
    if sandbox.check(os.environ, Path.cwd()):
        pytest.skip("bubblewrap cannot run here")
    return sandbox


def test_a_hidden_directory_is_empty_inside(tmp_path: Path) -> None:
    """What the tool host does with its own socket's directory, wherever it is (here one
    under /var/tmp, which the private /tmp does not cover)."""
    ws = tmp_path / "ws"
    ws.mkdir()
    run_dir = Path("/var/tmp") / f"loopd-test-{os.getpid()}"
    run_dir.mkdir(exist_ok=True)
    (run_dir / "host.sock").write_text("")
    try:
        sandbox = Sandbox(hide=(str(run_dir),))
        bwrap = sandbox.bwrap(os.environ) or ""
        _real()
        out = run_shell(
            sandbox.argv(bwrap, f"ls -A {run_dir}; echo end", ws), cwd=ws,
            env=sandbox.environment(os.environ), timeout_s=20, max_output=1000,
        )  # fmt: skip
        assert (out.exit_code, out.output) == (0, b"end\n")
    finally:
        (run_dir / "host.sock").unlink()
        run_dir.rmdir()


def test_without_a_memory_cgroup_each_process_gets_an_address_space_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where no memory cgroup can be made (a container, a user without a delegated cgroup),
    RLIMIT_AS holds a shared anonymous map, which RLIMIT_DATA does not count."""
    _real()

    def no_memory(*, pids: int = 0, memory: int = 0) -> CommandGroup:
        if memory:
            raise OSError("no cgroup hierarchy with the memory controller is mounted")
        return real_make(pids=pids)

    real_make = CommandGroup.make
    monkeypatch.setattr(CommandGroup, "make", staticmethod(no_memory))
    ws = tmp_path / "ws"
    ws.mkdir()
    sandbox = Sandbox(bounds=dataclasses.replace(Bounds.of(ShellConfig()), memory_mb=64))
    launch = sandbox.launch(20)
    assert not launch.memory_whole
    assert (resource.RLIMIT_AS, (64 << 20,) * 2) in launch.limits
    script = "import mmap; m = mmap.mmap(-1, 200 << 20); print('mapped')"
    try:
        out = run_shell(
            sandbox.argv(sandbox.bwrap(os.environ) or "", f"{sys.executable} -c \"{script}\"",
                         ws, launch),
            cwd=ws, env=sandbox.environment(os.environ), timeout_s=20, max_output=4000,
            pass_fds=launch.pass_fds(), started=lambda: launch.bound(20),
        )  # fmt: skip
    finally:
        launch.close()
    text = out.output.decode()
    assert "mapped" not in text and "Cannot allocate memory" in text, text
    said = sandbox.bounds.stopped_by(out.exit_code, text, 20, launch)
    assert said.startswith("each process may use 64 MiB of address space"), said
