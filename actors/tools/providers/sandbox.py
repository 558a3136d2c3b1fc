"""Where ``run_command`` runs: inside bubblewrap (``bwrap``), or, when told, without a sandbox.

The sandbox (docs/sandbox.md) is bubblewrap's command line, built here and nowhere else:

- the root file system read-only (``--ro-bind / /``), the workspace read-write on top;
  ``/proc/sys`` (and the other kernel knobs under ``/proc``) read-only in its own ``/proc``;
- a private ``/tmp`` and ``/run`` (empty tmpfs: the tool hosts' sockets, the D-Bus and
  Docker sockets and the like are not there to connect to; ``hide`` empties the directory
  of the host's own socket wherever it is), a minimal ``/dev``, a ``/proc`` of its own;
- every namespace bubblewrap can unshare (``--unshare-all``: pid, ipc, uts, cgroup, user
  where needed, and the network unless ``tools.shell.network = true``), so a ``setsid``
  child dies with the command; ``--die-with-parent``, so nothing outlives the tool host;
  ``--new-session``, so a command cannot push keystrokes into a terminal;
- an environment built from an allow-list (``tools.shell.env``), never the host's own.

Without ``bwrap`` on the PATH, or when it cannot make namespaces here, :meth:`Sandbox.check`
says why and how to fix it, and ``run_command`` refuses. ``sandbox = "none"`` runs
``/bin/sh`` directly, still with the allow-listed environment.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import os
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from actors.base.config import DEFAULT_ENV

__all__ = ["INSTALL", "Sandbox"]

# Names (fnmatch patterns) of the variables a command gets from the host's environment.
INSTALL = "apt-get install bubblewrap (Debian, Ubuntu), dnf install bubblewrap (Fedora)"
_DNS = "/run/systemd/resolve"  # where /etc/resolv.conf often points, masked with /run


@dataclasses.dataclass(frozen=True, slots=True)
class Sandbox:
    """How commands run: ``mode`` "bwrap" or "none", the network, the allowed environment."""

    mode: Literal["bwrap", "none"] = "bwrap"
    network: bool = False
    env: tuple[str, ...] = DEFAULT_ENV
    hide: tuple[str, ...] = ()  # directories shown empty (the tool host's own socket's)

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

    def argv(self, bwrap: str, command: str, workspace: Path) -> list[str]:
        """The command line that runs ``command`` under ``/bin/sh -c`` in the workspace."""
        shell = ["/bin/sh", "-c", command]
        if self.mode == "none":
            return shell
        ws = str(workspace)
        argv = [
            bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
            # its own /proc is writable: not the kernel's settings in it (a root user's
            # command could change the machine's sysctls through /proc/sys otherwise)
            "--ro-bind", "/proc/sys", "/proc/sys",
            "--ro-bind-try", "/proc/sysrq-trigger", "/proc/sysrq-trigger",
            "--ro-bind-try", "/proc/irq", "/proc/irq", "--ro-bind-try", "/proc/bus", "/proc/bus",
            "--tmpfs", "/tmp", "--tmpfs", "/run",
        ]  # fmt: skip
        if os.path.isdir("/var/run") and not os.path.islink("/var/run"):
            argv += ["--tmpfs", "/var/run"]
        if self.network:
            argv += ["--ro-bind-try", _DNS, _DNS]
        # a hidden directory that holds the workspace is emptied before the workspace is
        # bound into it; one inside the workspace after; the workspace itself never
        inside = [h for h in self.hide if Path(h).is_relative_to(workspace)]
        for path in self.hide:
            if path not in inside:
                argv += ["--tmpfs", path]
        argv += ["--bind", ws, ws]
        for path in inside:
            if Path(path) != workspace:
                argv += ["--tmpfs", path]
        argv += ["--chdir", ws, "--unshare-all"]
        if self.network:
            argv.append("--share-net")
        argv += ["--die-with-parent", "--new-session", "--", *shell]
        return argv

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
        return ""
