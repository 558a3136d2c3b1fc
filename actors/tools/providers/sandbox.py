"""Where ``run_command`` runs: inside bubblewrap (``bwrap``), or, when told, without a sandbox.

The sandbox (docs/sandbox.md) is bubblewrap's command line, built here and nowhere else:

- **no privilege**: a user namespace of its own with an unprivileged uid inside (65534 when
  loopd runs as root, else the user's own), every capability dropped (``--cap-drop ALL``)
  and no further user namespaces (``--disable-userns``), so no mount of the sandbox can be
  changed from inside (``umount /tmp``, ``mount -o remount,rw /`` fail) and nothing it can
  make (a nested namespace) unlocks one;
- the root file system read-only (``--ro-bind / /``), the workspace read-write on top, its
  repositories' ``.git`` read-only again as a whole, and the top ``loopd.toml``
  (:func:`_git_code`: git runs commands from them: a hook a command left there would run
  the next time *you* use git, outside any sandbox); a ``loopd.toml`` a command makes at
  the top is removed after it (:func:`remove_new_config`);
  ``/proc/sys`` and the other kernel knobs under ``/proc`` read-only in its own ``/proc``;
- a private ``/tmp``, ``/run`` and ``/dev/shm`` (tmpfs of ``tools.shell.tmpfs_mb`` each), a
  minimal read-only ``/dev``, a ``/proc`` of its own;
- loopd's own places hidden (``hide``: :func:`actors.base.private_places.private_places` and the
  host's socket directory): an empty read-only directory, or an empty file, over each, so no
  loopd socket is there to connect to and no log or key to read;
- every namespace bubblewrap can unshare (``--unshare-all``: pid, ipc, uts, cgroup, user,
  and the network unless ``tools.shell.network = true``), so a ``setsid`` child dies with
  the command; ``--die-with-parent``, so nothing outlives the tool host; ``--new-session``,
  so a command cannot push keystrokes into a terminal;
- **bounds** (:class:`Bounds`) set on the sandbox's first process before the command runs
  (bwrap waits on ``--block-fd`` while the host sets them with ``prlimit``), inherited by
  everything it starts: data memory, file size and CPU time per process, and processes in
  the sandbox (counted per user namespace, so only the sandbox's own); the memory of all
  its processes together in a memory cgroup of its own where one can be made, else the
  address space of each process (:mod:`actors.tools.providers.pidgroup`);
- an environment built from an allow-list (``tools.shell.env``), never the host's own.

Without ``bwrap`` on the PATH, or when it cannot make its sandbox here, :meth:`Sandbox.check`
says why and how to fix it, and ``run_command`` refuses. ``sandbox = "none"`` runs
``/bin/sh`` directly, still with the allow-listed environment, and without the bounds.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import json
import os
import re
import resource
import select
import shutil
import signal
import stat
import subprocess
import time
from collections.abc import Iterable, Mapping
from functools import lru_cache
from pathlib import Path
from typing import Literal

from actors.base.config import DEFAULT_ENV, ShellConfig
from actors.tools.providers.pidgroup import CommandGroup
from actors.tools.providers.pidgroup import why_not as pidgroup_why_not

__all__ = ["INSTALL", "Bounds", "Launch", "Sandbox"]

INSTALL = "apt-get install bubblewrap (Debian, Ubuntu), dnf install bubblewrap (Fedora)"
_DNS = "/run/systemd/resolve"  # where /etc/resolv.conf often points, masked with /run
_NOBODY = "65534"  # the uid and gid inside when loopd runs as root
_PRIVATE = ("/tmp", "/run", "/var/run", "/dev", "/proc")  # fresh in the sandbox already
_MIB = 1024 * 1024


@dataclasses.dataclass(frozen=True, slots=True)
class Bounds:
    """What one command may use (``[tools.shell]``); 0: no bound."""

    tmpfs_mb: int  # the size of each of its /tmp, /run, /dev/shm
    memory_mb: int  # all its processes (a memory cgroup), else each one's address space
    processes: int  # processes and threads in the sandbox at once (RLIMIT_NPROC)
    file_mb: int  # the largest file a process may write (RLIMIT_FSIZE)
    cpu_s: float  # CPU seconds of each process (RLIMIT_CPU); 0: the call's time limit

    @staticmethod
    def of(shell: ShellConfig) -> Bounds:
        return Bounds(shell.tmpfs_mb, shell.memory_mb, shell.processes, shell.file_mb,
                      shell.cpu_s)

    def rlimits(self, time_limit: float) -> list[tuple[int, tuple[int, int]]]:
        """The (resource, (soft, hard)) limits for a command with ``time_limit`` seconds."""
        cpu = self.cpu_s or time_limit
        limits = [(resource.RLIMIT_CPU, (max(1, int(cpu + 0.999)), max(1, int(cpu + 0.999)) + 1))]
        if self.memory_mb:
            limits.append((resource.RLIMIT_DATA, (self.memory_mb * _MIB,) * 2))
        if self.processes:
            limits.append((resource.RLIMIT_NPROC, (self.processes,) * 2))
        if self.file_mb:
            limits.append((resource.RLIMIT_FSIZE, (self.file_mb * _MIB,) * 2))
        return limits

    def stopped_by(self, exit_code: int | None, output: str, time_limit: float,
                   launch: Launch | None = None) -> str:
        """Which bound most likely stopped a command that failed, in words; "" if none.
        ``launch``: how it was bounded (a memory cgroup, and what the kernel killed there)."""
        if not exit_code:
            return ""
        whole = launch is not None and launch.memory_whole
        if whole and launch is not None and launch.oom_kills:
            return (f"the command's processes together may use {self.memory_mb} MiB of memory "
                    "(tools.shell.memory_mb); the kernel killed one at that bound")
        if exit_code in (128 + signal.SIGXCPU, -signal.SIGXCPU):
            return (f"a process used up its CPU time, {self.cpu_s or time_limit:g} s "
                    "(tools.shell.cpu_s), and was stopped")
        if exit_code in (128 + signal.SIGXFSZ, -signal.SIGXFSZ):
            return (f"a process wrote a file past {self.file_mb} MiB (tools.shell.file_mb) and "
                    "was stopped")
        said = output.lower()
        if self.tmpfs_mb and "no space left on device" in said:
            return (f"/tmp, /run and /dev/shm hold {self.tmpfs_mb} MiB each "
                    "(tools.shell.tmpfs_mb); write big files in the workspace")
        if self.memory_mb and any(t in said for t in (
                "cannot allocate memory", "memoryerror", "out of memory", "bad_alloc")):
            if whole:
                return (f"the command's processes together may use {self.memory_mb} MiB of "
                        "memory, each at most that much data memory (tools.shell.memory_mb)")
            return (f"each process may use {self.memory_mb} MiB of address space "
                    "(tools.shell.memory_mb; no memory cgroup can be made here, so the "
                    "processes together are not bounded)")
        if self.processes and any(t in said for t in (
                "resource temporarily unavailable", "cannot fork", "can't fork")):
            return (f"the command may run {self.processes} processes and threads at once "
                    "(tools.shell.processes)")
        return ""


@lru_cache(maxsize=8)
def _features(bwrap: str) -> frozenset[str]:
    """The options of ``bwrap --help`` this build knows (older builds lack some)."""
    try:
        said = subprocess.run([bwrap, "--help"], capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return frozenset()
    text = (said.stdout + said.stderr).decode(errors="replace")
    return frozenset(w for w in ("--size", "--disable-userns", "--cap-drop") if w in text)


@dataclasses.dataclass(frozen=True, slots=True)
class Sandbox:
    """How commands run: ``mode`` "bwrap" or "none", the network, the allowed environment,
    what is hidden, the bounds."""

    mode: Literal["bwrap", "none"] = "bwrap"
    network: bool = False
    env: tuple[str, ...] = DEFAULT_ENV
    hide: tuple[str, ...] = ()  # absolute paths shown empty (loopd's own places)
    bounds: Bounds = dataclasses.field(default_factory=lambda: Bounds.of(ShellConfig()))

    def environment(self, source: Mapping[str, str]) -> dict[str, str]:
        """The variables of ``source`` that the allow-list names; nothing else."""
        kept = {k: v for k, v in source.items() if any(fnmatch.fnmatchcase(k, p) for p in self.env)}
        kept.setdefault("PATH", os.defpath)
        if self.mode == "bwrap":
            kept["TMPDIR"] = "/tmp"  # the private one
        return kept

    def bwrap(self, source: Mapping[str, str]) -> str | None:
        """The bwrap executable on the PATH of ``source``, if there is one."""
        return shutil.which("bwrap", path=source.get("PATH", os.defpath))

    def argv(self, bwrap: str, command: str, workspace: Path,
             launch: Launch | None = None) -> list[str]:
        """The command line that runs ``command`` under ``/bin/sh -c`` in the workspace;
        with ``launch``, the command waits for its bounds (:class:`Launch`)."""
        shell = ["/bin/sh", "-c", command]
        if self.mode == "none":
            return shell
        features = _features(bwrap)
        ws = str(workspace)
        argv = [
            bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
            # its own /proc is writable: not the kernel's settings in it
            "--ro-bind", "/proc/sys", "/proc/sys",
            "--ro-bind-try", "/proc/sysrq-trigger", "/proc/sysrq-trigger",
            "--ro-bind-try", "/proc/irq", "/proc/irq", "--ro-bind-try", "/proc/bus", "/proc/bus",
        ]  # fmt: skip
        scratch = ["/tmp", "/run", "/dev/shm"]
        if os.path.isdir("/var/run") and not os.path.islink("/var/run"):
            scratch.append("/var/run")
        for path in scratch:
            argv += [*self._size(features), "--perms", "1777", "--tmpfs", path]
        argv += ["--remount-ro", "/dev"]
        if self.network:
            argv += ["--ro-bind-try", _DNS, _DNS]
        around, inside, files = self._hidden(workspace)
        for path in around:  # emptied first; the workspace is bound into it, then it is locked
            argv += ["--tmpfs", path]
        argv += ["--bind", ws, ws]
        for path in around:
            argv += ["--remount-ro", path]
        for path in inside:
            argv += ["--tmpfs", path, "--remount-ro", path]
        for path in files:
            argv += ["--ro-bind", "/dev/null", path]
        for path in _git_code(workspace):
            if path not in files:  # a config kept there stays hidden
                argv += ["--ro-bind", path, path]
        argv += ["--chdir", ws, "--unshare-all", "--unshare-user"]
        if os.geteuid() == 0:
            argv += ["--uid", _NOBODY, "--gid", _NOBODY]
        if "--cap-drop" in features:
            argv += ["--cap-drop", "ALL"]
        if "--disable-userns" in features:
            argv.append("--disable-userns")
        if self.network:
            argv.append("--share-net")
        if launch is not None:
            argv += launch.flags()
        argv += ["--die-with-parent", "--new-session", "--", *shell]
        return argv

    def launch(self, time_limit: float) -> Launch:
        """How one command with ``time_limit`` seconds is bounded: its rlimits; a memory
        cgroup for all its processes when one can be made, else an address-space limit
        per process (RLIMIT_AS: a shared ``mmap`` or a mapped ``memfd`` counts there, not
        in RLIMIT_DATA); and as root (where the kernel does not apply RLIMIT_NPROC) a pids
        cgroup when one can be made."""
        limits = self.bounds.rlimits(time_limit)
        pids = self.bounds.processes if os.geteuid() == 0 else 0
        if pids:
            limits = [(r, v) for r, v in limits if r != resource.RLIMIT_NPROC]
        memory = self.bounds.memory_mb * _MIB
        group = None
        try:
            group = CommandGroup.make(pids=pids, memory=memory) if pids or memory else None
        except OSError:
            memory = 0  # bounded per process below
            with contextlib.suppress(OSError):  # said at start (process_bound_problem)
                group = CommandGroup.make(pids=pids) if pids else None
        if self.bounds.memory_mb and not memory:
            limits.append((resource.RLIMIT_AS, (self.bounds.memory_mb * _MIB,) * 2))
        return Launch(limits, group, memory_whole=bool(memory))

    def process_bound_problem(self) -> str:
        """Why the process bound will not hold here ("" when it will)."""
        if self.mode == "none" or not self.bounds.processes or os.geteuid() != 0:
            return ""
        why = pidgroup_why_not()
        if not why:
            return ""
        return (f"run_command: tools.shell.processes ({self.bounds.processes}) is not enforced: "
                "loopd runs as root, where the kernel ignores RLIMIT_NPROC, and no pids "
                f"cgroup can be made here ({why})")

    def _size(self, features: frozenset[str]) -> list[str]:
        if not self.bounds.tmpfs_mb or "--size" not in features:
            return []
        return ["--size", str(self.bounds.tmpfs_mb * _MIB)]

    def _hidden(self, workspace: Path) -> tuple[list[str], list[str], list[str]]:
        """The hidden places that exist now (real paths): directories outside the workspace
        (some may hold it), directories inside it, and files; none under another of its
        kind. Those under a place the sandbox makes fresh, and the workspace, need nothing."""
        outside: set[str] = set()
        inside: set[str] = set()
        files: set[str] = set()
        for given in self.hide:
            path = os.path.realpath(given)
            if path == str(workspace) or _under(path, _PRIVATE):
                continue
            try:
                mode = os.stat(path).st_mode
            except OSError:
                continue  # not there (yet): nothing to hide
            if stat.S_ISDIR(mode):
                (inside if _under(path, (str(workspace),)) else outside).add(path)
            elif stat.S_ISREG(mode):
                files.add(path)
        outside = {p for p in outside if not _under(p, outside - {p})}
        inside = {p for p in inside if not _under(p, inside - {p})}
        files = {f for f in files if not _under(f, inside) and (
            _under(f, (str(workspace),)) or not _under(f, outside))}
        return sorted(outside), sorted(inside), sorted(files)

    def check(self, source: Mapping[str, str], workspace: Path) -> str:
        """"" when commands can run; else why not and what to do (for run_command to say)."""
        if self.mode == "none":
            return ""
        bwrap = self.bwrap(source)
        if bwrap is None:
            return (
                "run_command runs commands in a bubblewrap sandbox, and bwrap is not on the "
                f"PATH ({source.get('PATH', os.defpath)}). Install it: {INSTALL}; or set "
                'tools.shell.sandbox = "none" in the config to run commands without a sandbox'
            )
        try:
            probe = subprocess.run(
                self.argv(bwrap, "true", workspace),
                env=self.environment(source),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=30,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"run_command: bubblewrap ({bwrap}) could not be started: {e}"
        if probe.returncode != 0:
            said = probe.stderr.decode(errors="replace").strip()[-500:]
            return (
                f"run_command: bubblewrap ({bwrap}) cannot make its sandbox here: {said}. "
                "It needs user namespaces for a user other than root (sysctl "
                "kernel.unprivileged_userns_clone=1; on Ubuntu 24.04 also "
                "kernel.apparmor_restrict_unprivileged_userns=0), or run loopd as root; or "
                'set tools.shell.sandbox = "none" to run commands without a sandbox'
            )
        if self.bounds.tmpfs_mb and "--size" not in _features(bwrap):
            return (
                f"run_command: bubblewrap ({bwrap}) cannot bound the size of the sandbox's /tmp "
                "(it has no --size option: bubblewrap 0.8 and later do); install a newer one, "
                "or set tools.shell.tmpfs_mb = 0 to leave /tmp unbounded"
            )
        return ""


def _under(path: str, dirs: Iterable[str]) -> bool:
    """True when ``path`` is one of ``dirs`` or below one."""
    return any(path == d or path.startswith(d.rstrip("/") + "/") for d in dirs)


def _git_code(workspace: Path) -> list[str]:
    """What git and loopd find commands in, bound read-only as a whole: every ``.git`` of
    the workspace's repositories (a directory: config, hooks, ``modules/*`` of its
    submodules, everything; a worktree's or submodule's pointer file) down to
    :data:`GIT_DEPTH` levels and wherever ``.gitmodules`` puts a submodule, and the top
    ``loopd.toml`` (a config there could allow every call). Each is a mount point inside,
    so it cannot be renamed, replaced or removed either (``mv .git .git-old`` fails)."""
    found = []
    with contextlib.suppress(OSError):  # loopd's own config, when it is kept here
        if stat.S_ISREG(os.lstat(workspace / "loopd.toml").st_mode):
            found.append(str(workspace / "loopd.toml"))
    gits = _gits(workspace)
    for repo in _submodules(workspace):
        git = repo / ".git"
        with contextlib.suppress(OSError):
            mode = os.lstat(git).st_mode
            if stat.S_ISDIR(mode) or stat.S_ISREG(mode):
                gits.append(str(git))
    return found + list(dict.fromkeys(gits))


GIT_DEPTH = 3  # directory levels below the workspace searched for repositories' .git
_GIT_BUDGET = 2_000  # directories looked into at most per command (a huge tree: its top)
_NOT_REPOS = frozenset({"node_modules", ".venv", "__pycache__", ".mypy_cache", ".tox",
                        ".pytest_cache", ".ruff_cache"})


def _gits(workspace: Path) -> list[str]:
    """The ``.git`` directories and files at the top and down to :data:`GIT_DEPTH` levels,
    breadth first (symlinks not followed, ``.git`` and package caches not entered)."""
    found: list[str] = []
    level, budget = [str(workspace)], _GIT_BUDGET
    for depth in range(GIT_DEPTH + 1):
        below: list[str] = []
        for path in level:
            budget -= 1
            if budget < 0:
                return found
            try:
                with os.scandir(path) as it:
                    for e in it:
                        if e.name == ".git":
                            if e.is_dir(follow_symlinks=False) or e.is_file(follow_symlinks=False):
                                found.append(e.path)
                        elif (depth < GIT_DEPTH and e.name not in _NOT_REPOS
                              and e.is_dir(follow_symlinks=False)):
                            below.append(e.path)
            except OSError:
                continue
        level = below
    return found


_GITMODULE_PATH = re.compile(r"^\s*path\s*=\s*(.+?)\s*$", re.MULTILINE)


def _submodules(workspace: Path) -> list[Path]:
    """The worktrees of the submodules ``.gitmodules`` names (inside the workspace only)."""
    try:
        text = (workspace / ".gitmodules").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    paths = []
    for found in _GITMODULE_PATH.findall(text):
        rel = found.strip('"')
        if rel and not os.path.isabs(rel) and ".." not in Path(rel).parts:
            paths.append(workspace / rel)
    return paths


def config_present(workspace: Path) -> bool:
    """Whether the top of the workspace holds a ``loopd.toml`` (anything by that name)."""
    return os.path.lexists(workspace / "loopd.toml")


def remove_new_config(workspace: Path, before: bool) -> str:
    """After a command: a ``loopd.toml`` it made at the top of the workspace (there was none
    ``before``) is removed; what to tell about it, "" when nothing."""
    path = workspace / "loopd.toml"
    if before:
        return ""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return ""
    try:
        if stat.S_ISDIR(mode):
            shutil.rmtree(path)
        else:
            path.unlink()
    except OSError as e:
        return f"the command made {path} and it could not be removed ({e}): remove it"
    return "the command made loopd.toml at the top of the workspace; it was removed"


class Launch:
    """One sandboxed command's start: bwrap tells the pid of the sandbox's first process on
    ``--info-fd``, then waits on ``--block-fd`` until the host has set that process's
    rlimits (and put it in its pids cgroup, as root) in :meth:`bound`."""

    def __init__(self, limits: list[tuple[int, tuple[int, int]]],
                 group: CommandGroup | None = None, *, memory_whole: bool = False) -> None:
        self.limits, self.group = limits, group
        self.memory_whole = memory_whole  # a memory cgroup bounds the command as a whole
        self.oom_kills = 0  # its processes the kernel killed at that bound (read at close)
        self._info_r, self._info_w = os.pipe()
        self._block_r, self._block_w = os.pipe()
        self._open = [self._info_r, self._info_w, self._block_r, self._block_w]

    def flags(self) -> list[str]:
        return ["--info-fd", str(self._info_w), "--block-fd", str(self._block_r)]

    def pass_fds(self) -> tuple[int, int]:
        return self._info_w, self._block_r

    def bound(self, timeout_s: float) -> str:
        """Once bwrap started: bound its sandbox and let the command run; why not (the
        command must then not run: the caller kills it first) or ""."""
        self._close(self._info_w, self._block_r)  # the child's ends
        info, ended = self._read_info(timeout_s)
        if not info:  # ended: bwrap failed before its sandbox (its output says why)
            return "" if ended else f"bubblewrap did not say its pid within {timeout_s:g} s"
        try:
            pid = int(json.loads(info)["child-pid"])
        except (ValueError, KeyError, TypeError):
            return f"bubblewrap said something unexpected on --info-fd: {info[:200]!r}"
        try:
            for which, value in self.limits:
                resource.prlimit(pid, which, value)
            if self.group is not None:
                self.group.join(pid)
        except ProcessLookupError:
            return ""  # the sandbox ended already: nothing runs
        except OSError as e:
            return f"the sandbox's bounds could not be set ({e}), so the command did not run"
        os.write(self._block_w, b"x")
        return ""

    def _read_info(self, timeout_s: float) -> tuple[str, bool]:
        """What bwrap wrote on --info-fd, and whether it closed it (else: the time ran out)."""
        data = b""
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select([self._info_r], [], [], left)
            if not ready:
                continue
            chunk = os.read(self._info_r, 4096)
            if not chunk:
                return data.decode(errors="replace"), True
            data += chunk
            if b"}" in data:  # all of it (bwrap writes one small object)
                return data.decode(errors="replace"), False
        return data.decode(errors="replace"), False

    def _close(self, *fds: int) -> None:
        for fd in fds:
            if fd in self._open:
                self._open.remove(fd)
                os.close(fd)

    def close(self) -> None:
        """Close what is left and remove the cgroup (after every process of it is gone)."""
        self._close(*list(self._open))
        if self.group is not None:
            self.oom_kills = self.group.oom_kills()
            self.group.remove()
