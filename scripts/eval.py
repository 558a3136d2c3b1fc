"""`make eval`: fixed tasks on the embedded model, with the defaults a new user gets.

The task files of ``examples/eval`` (``*.toml``; garden.toml's header says what a task
checks) each name a workspace (a folder of ``examples/eval/workspaces``, or this repository
copied) and a set: ``tuned`` (defaults were chosen on it), ``never-tuned`` (never used to
choose), ``repo`` (this repository as the workspace), ``long`` (one long chat) or
``overflow`` (chats longer than the context: scripts/eval_overflow.py runs them once per way
on, compaction or a new session each time the context is full). Each task is one turn;
tasks that name the same ``session`` run one after another in one session (a follow-up
question), every other task in a new session. A session starts on a fresh copy of
its workspace, with ``Config()`` (no ``--config``, no ``$LOOPD_CONFIG``): the embedded model,
the standard tool hosts, the built-in system prompt and tools. Only what a harness must
change is changed: the log directory and the workspace (temporary copies), and a fixed
sampling seed so that a run can be repeated (the temperature stays the default).

A turn is scored from the answer and the log: which tools ran (a call through
``call_tool`` counts as the tool it names), with which arguments, what the answer says, and
for a write, the file. It prints a table per task, then the pass rate per task file, per
set, per kind of task and overall (the tuned and never-tuned sets; repo and long apart), and
writes ``bench/eval.json`` (like ``make bench``).

    python -m scripts.eval                       # every task file but set overflow's
    python -m scripts.eval --set never-tuned     # the files of some sets
    python -m scripts.eval --tasks examples/eval/notes.toml   # some files
    python -m scripts.eval n-read-todo n-launch  # some tasks, by id (and their sessions)
    python -m scripts.eval --config FILE         # another config (to compare), same tasks
    python -m scripts.eval -v n-launch           # and each turn's calls, results and answers
    python -m scripts.eval --set overflow --way elide --way elide@0.5   # some ways only
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from actors.base import config as cfg
from actors.base.cancel import CancelToken
from actors.base.errors import LoopdError, SessionFull
from actors.base.events import Choice, Compacted, Decision
from actors.log.file import read_records
from actors.log.records import (
    AgentLink,
    Assistant,
    Compaction,
    Cut,
    Record,
    ToolResult,
    Usage,
    User,
)
from actors.log.sessiondir import session_path
from actors.session.frame_words import frame_piece
from actors.session.smallmodel.bare_json import parse_bare_tool_call
from actors.tools.protocol.standard_specs import STANDARD_SPECS
from actors.tools.registry import META_TOOLS

ROOT = Path(__file__).resolve().parent.parent
EVAL_DIR = ROOT / "examples" / "eval"
WORKSPACES = EVAL_DIR / "workspaces"
TASKS = EVAL_DIR / "garden.toml"
OUT = ROOT / "bench" / "eval.json"
SEED = 7
TASK_TIMEOUT_S = 150.0  # a turn still running then is cancelled and fails ("timeout")
SERVERS = EVAL_DIR / "servers"  # the MCP servers a task file may run beside the standard tools
# The sets, in the order they are reported; the first two make the overall rate.
# "never-tuned-repo" (real projects built from installed packages) and "own-tools" (MCP
# servers of a person's own) are reported apart and never used to choose a default;
# "tuned-repo" holds the real projects whose misses were read to choose the code tools.
SETS = ("tuned", "never-tuned", "repo", "tuned-repo", "never-tuned-repo", "own-tools", "long",
        "long-repo", "overflow")
OVERALL = SETS[:2]
OPT_IN = ("overflow",)  # run only when asked for: each file once per way, hours in all
# The harness answers approvals (actors.approval.gate): "allow once" for a task marked approve,
# a denial for any other, so a write task checks the file on disk. False: check the call
# the model made (path and content) instead.
APPROVAL = True

__all__ = [
    "Call", "Row", "Task", "TaskFile", "calls_of", "load_file", "load_tasks", "main",
    "run_tasks", "score", "sessions", "summary", "task_files",
]  # fmt: skip


# --- tasks ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Task:
    id: str
    kind: str
    prompt: str
    session: str = ""  # tasks naming the same session run in one, in the file's order
    tools: tuple[str, ...] = ()
    tools_any: tuple[str, ...] = ()
    ordered: bool = False
    args: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
    no_tools: bool = False
    answer_all: tuple[str, ...] = ()
    answer_any: tuple[str, ...] = ()
    answer_none: tuple[str, ...] = ()
    approve: bool = False
    file: Mapping[str, str] | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class TaskFile:
    """One task file: its tasks, the workspace they run on and the set it belongs to."""

    name: str  # the file's name without .toml
    # a folder of WORKSPACES; "" for this repository, copied (set "repo"); "package:NAME"
    # for the source of an installed package as its sdist holds it (the package's folder,
    # PKG-INFO and README.md from its metadata); "empty" for an empty folder
    workspace: str
    set: str
    tasks: tuple[Task, ...]
    servers: tuple[str, ...] = ()  # MCP servers of SERVERS (file names) the session has


def load_file(path: Path) -> TaskFile:
    """A task file; an unknown key, a repeated id, an unknown set or workspace is refused."""
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    unknown = set(data) - {"workspace", "set", "session", "task", "servers"}
    if unknown:
        raise ValueError(f"{path}: unknown key(s) {', '.join(sorted(unknown))}")
    kind = data.get("set", "")
    if kind not in SETS:
        raise ValueError(f"{path}: set must be one of {', '.join(SETS)}, not {kind!r}")
    workspace = data.get("workspace", "")
    if kind == "repo" and workspace:
        raise ValueError(f"{path}: a repo file runs on this repository: no workspace")
    if kind != "repo" and not (workspace and _workspace_there(workspace)):
        raise ValueError(f"{path}: workspace {workspace!r} is not a folder of {WORKSPACES}, "
                         "an installed package (package:NAME) nor \"empty\"")
    servers = tuple(data.get("servers", ()))
    for server in servers:
        if not (SERVERS / server).is_file():
            raise ValueError(f"{path}: server {server!r} is not a file of {SERVERS}")
    fields = {f.name for f in dataclasses.fields(Task)}
    tasks: list[Task] = []
    for i, raw in enumerate(data.get("task", [])):
        bad = set(raw) - fields
        if bad:
            raise ValueError(f"{path}: task {i} has unknown key(s) {', '.join(sorted(bad))}")
        values: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v
                                  for k, v in raw.items()}
        values.setdefault("session", data.get("session", ""))
        tasks.append(Task(**values))
    ids = [t.id for t in tasks]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{path}: task ids repeat")
    return TaskFile(path.stem, workspace, kind, tuple(tasks), servers)


def _workspace_there(workspace: str) -> bool:
    if workspace == "empty":
        return True
    if workspace.startswith("package:"):
        return _package_dir(workspace.removeprefix("package:")) is not None
    return (WORKSPACES / workspace).is_dir()


def _package_dir(name: str) -> Path | None:
    """The folder of an installed package (its ``__init__.py``'s), or None."""
    import importlib.util

    spec = importlib.util.find_spec(name)
    origin = spec.origin if spec is not None else None
    return Path(origin).parent if origin and origin.endswith("__init__.py") else None


def load_tasks(path: Path = TASKS) -> list[Task]:
    """The tasks of one task file."""
    return list(load_file(path).tasks)


def task_files(directory: Path = EVAL_DIR) -> list[TaskFile]:
    """Every task file of ``directory``, by set (in SETS' order), then by name."""
    files = [load_file(p) for p in sorted(directory.glob("*.toml"))]
    ids = [t.id for f in files for t in f.tasks]
    repeated = sorted({i for i in ids if ids.count(i) > 1})
    if repeated:
        raise ValueError(f"task ids repeat across the files of {directory}: {repeated}")
    return sorted(files, key=lambda f: SETS.index(f.set))


def sessions(tasks: Sequence[Task]) -> list[list[Task]]:
    """The tasks in the sessions they run in: one per task, or one per named session (its
    tasks in order, where its first task stands)."""
    out: list[list[Task]] = []
    named: dict[str, list[Task]] = {}
    for task in tasks:
        if not task.session:
            out.append([task])
        elif task.session in named:
            named[task.session].append(task)
        else:
            named[task.session] = [task]
            out.append(named[task.session])
    return out


def chosen(files: Sequence[TaskFile], sets: Sequence[str], ids: Sequence[str], *,
           named: bool = False) -> list[TaskFile]:
    """The files (and tasks) a run does: those of ``sets`` (all when none), then only the
    tasks ``ids``. The sets of OPT_IN (hours on the embedded model) only when named by
    ``--set``, by a task's id or by its file (``named``)."""
    wanted = set(sets) if sets else {f.set for f in files if named or ids
                                     or f.set not in OPT_IN}
    files = [f for f in files if f.set in wanted]
    return select(files, ids) if ids else files


def select(files: Sequence[TaskFile], ids: Iterable[str]) -> list[TaskFile]:
    """The files with only the tasks ``ids`` and the earlier tasks of their sessions."""
    wanted = set(ids)
    unknown = wanted - {t.id for f in files for t in f.tasks}
    if unknown:
        raise ValueError(f"unknown task(s): {', '.join(sorted(unknown))}")
    out: list[TaskFile] = []
    for f in files:
        keep: list[Task] = []
        for group in sessions(f.tasks):
            last = max((i for i, t in enumerate(group) if t.id in wanted), default=-1)
            keep += group[: last + 1]
        if keep:
            out.append(dataclasses.replace(f, tasks=tuple(keep)))
    return out


# --- scoring -------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Call:
    """A tool call as the model meant it: call_tool unwrapped to the tool it names."""

    name: str
    arguments: Mapping[str, Any]
    result: str | None  # the ToolResult's text; None when it never ran


def calls_of(records: Iterable[Record]) -> list[Call]:
    """Every tool call of the records, in order, with its result."""
    results = {r.tool_call_id: r.content for r in records if isinstance(r, ToolResult)}
    calls: list[Call] = []
    for r in records:
        if not isinstance(r, Assistant):
            continue
        for c in r.tool_calls:
            name, arguments = c.name, _object(c.arguments)
            if name == "call_tool" and isinstance(arguments.get("name"), str):
                inner = arguments.get("arguments", {})
                name = arguments["name"]
                arguments = _object(inner) if isinstance(inner, str) else (
                    dict(inner) if isinstance(inner, Mapping) else {}
                )
            calls.append(Call(name, arguments, results.get(c.id)))
    return calls


def children_of(turn: Sequence[Record], read: Callable[[str], Sequence[Record]],
                seen: set[str] | None = None) -> list[Sequence[Record]]:
    """The logs of the child agents ``turn`` started, their own children's after each
    (``read``: a session's records): with ``[agents] enabled`` a file a child read counts as
    read by the turn, and what the children processed as the turn's."""
    seen = set() if seen is None else seen
    out: list[Sequence[Record]] = []
    for link in turn:
        if isinstance(link, AgentLink) and link.child not in seen:
            seen.add(link.child)  # a child's log holds its own link too: read once
            records = read(link.child)
            out += [records, *children_of(records, read, seen)]
    return out


def _object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _same(key: str, want: Any, got: Any) -> bool:
    if key == "path" and isinstance(got, str) and isinstance(want, str):
        return got.removeprefix("./").strip("/") == want.removeprefix("./").strip("/")
    return bool(want == got)


def score(
    task: Task,
    answer: str | None,
    error: str | None,
    records: Sequence[Record],
    workspace: Path,
    *,
    approval: bool = APPROVAL,
    children: Sequence[Sequence[Record]] = (),
) -> tuple[bool, str]:
    """``(passed, why)``: why is the first check that failed, or "ok". ``children``: the
    logs of the child agents the turn started (their calls count as the turn's)."""
    if error is not None:
        return False, error
    text = (answer or "").strip()
    if not text:
        return False, "no answer"
    framed = frame_text(text)
    if framed is not None:
        return False, f"the answer holds the compaction's frame ({framed!r})"
    if parse_bare_tool_call(text, {c.name for c in calls_of(records)} | _ALL_TOOLS) or (
        text.startswith("{") and '"name"' in text
    ):
        return False, "the answer is a tool call written as text"
    calls = [*calls_of(records), *(c for log in children for c in calls_of(log))]
    ran = [c for c in calls if c.result is not None]
    if task.no_tools and calls:
        return False, f"called {', '.join(c.name for c in calls)} (no tool needed)"
    names = [c.name for c in ran]
    for tool in task.tools:
        if tool not in names:
            return False, f"{tool} was not called" + (f" (called: {', '.join(names)})"
                                                       if names else "")
    if task.tools_any and not set(task.tools_any) & set(names):
        return False, f"none of {', '.join(task.tools_any)} was called" + (
            f" (called: {', '.join(names)})" if names else "")
    if task.ordered:
        firsts = [names.index(t) for t in task.tools]
        if firsts != sorted(firsts):
            return False, f"tools not in the order {', '.join(task.tools)}"
    for tool, want in task.args.items():
        made = [c.arguments for c in ran if c.name == tool]
        if not any(all(_same(k, v, a.get(k)) for k, v in want.items()) for a in made):
            return False, f"{tool} never had {json.dumps(dict(want))} (had: {made})"
    low = text.lower()
    missing = [w for w in task.answer_all if w.lower() not in low]
    if missing:
        return False, f"the answer lacks {', '.join(map(repr, missing))}"
    if task.answer_any and not any(w.lower() in low for w in task.answer_any):
        return False, f"the answer has none of {', '.join(map(repr, task.answer_any))}"
    bad = [w for w in task.answer_none if w.lower() in low]
    if bad:
        return False, f"the answer says {', '.join(map(repr, bad))}"
    if task.file is not None:
        return _file_check(task.file, ran, workspace, approval)
    return True, "ok"


def frame_text(answer: str) -> str | None:
    """The first piece of a compaction's frame or an elided summary's own wording that
    ``answer`` holds (None: none): such text is loopd's, never an answer. The pieces are the
    ones the turn takes out of every answer of a compacted session (frame_words.PIECES)."""
    return frame_piece(answer)


def _file_check(
    want: Mapping[str, str], ran: Sequence[Call], workspace: Path, approval: bool
) -> tuple[bool, str]:
    path, contains = want["path"], want["contains"]
    if not approval:  # the call must say it; nothing can be written yet
        for c in ran:
            if c.name == "write_file" and _same("path", path, c.arguments.get("path")) and (
                contains.lower() in str(c.arguments.get("content", "")).lower()
            ):
                return True, "ok (the call; approval is not built yet)"
        return False, f"no write_file call of {path} with {contains!r}"
    target = workspace / path
    if not target.is_file():
        return False, f"{path} was not written"
    if contains.lower() not in target.read_text(encoding="utf-8", errors="replace").lower():
        return False, f"{path} does not contain {contains!r}"
    return True, "ok"


_ALL_TOOLS = {*STANDARD_SPECS, *(t["function"]["name"] for t in META_TOOLS)}


# --- running -------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Row:
    task: str
    kind: str
    passed: bool
    tool_calls: int
    prompt_tokens: int
    seconds: float
    why: str
    answer: str
    transcript: tuple[str, ...] = ()  # the turn's records, a line each (for -v)
    file: str = ""  # the task file's name, its workspace and set
    workspace: str = ""
    set: str = ""
    # Set "overflow" (scripts/eval_overflow.py): the way the conversation went on past the
    # context; the prompt tokens the server processed in the turn (llama-server's prompt_n,
    # not what its cache held; a summary request's included); whether it was asked again in
    # a new session because the context was full (SessionFull); the compactions made in the
    # turn, and the tokens the model wrote for their summaries (way summary).
    way: str = ""
    processed: int = 0
    restarted: bool = False
    compactions: int = 0
    written: int = 0


def eval_config(base: cfg.Config, root: Path, *, seed: int = SEED) -> cfg.Config:
    """``base`` with the harness's own log directory, workspace and rules file (none: the
    person's "always" answers must not change the score), and a fixed seed."""
    config = base.replace("log", dir=str(root / "sessions"))
    config = config.replace("tools", workspace=str(root / "workspace"),
                            rules_file=str(root / "rules.toml"))
    return config.replace("inference", seed=seed) if seed >= 0 else config


def run_tasks(
    files: Sequence[TaskFile],
    base: cfg.Config | None = None,
    *,
    timeout_s: float = TASK_TIMEOUT_S,
    seed: int = SEED,
    say: Callable[[str], None] = lambda _: None,
    restart: bool = False,
    way: str = "",
) -> list[Row]:
    """Run the tasks of ``files`` on one world (one model server, one set of tool hosts), a
    session at a time on a fresh copy of its workspace, and score each turn.

    ``restart``: a turn the context cannot hold (SessionFull) is asked again in a new
    session on the same workspace, and the rest of its session's tasks run there (what a
    person does without compaction); its row says ``restarted`` and counts both attempts'
    tokens processed, summary tokens, compactions and seconds. ``way`` labels the rows."""
    from actors.inference.slots.files import remove_session_files, slot_dirs
    from actors.log.sessiondir import session_path
    from actors.session.world import start_world

    root = Path(tempfile.mkdtemp(prefix="loopd-eval-"))
    config = eval_config(base if base is not None else cfg.Config(), root, seed=seed)
    workspace = root / "workspace"
    workspace.mkdir()
    names: list[str] = []
    rows: list[Row] = []
    try:
        for servers in dict.fromkeys(f.servers for f in files):  # one world per set of servers
            with start_world(with_servers(config, servers), say) as world:
                _run_files(world, [f for f in files if f.servers == servers], workspace,
                           timeout_s, restart, way, names, rows, say)
    finally:
        for name in names:
            remove_session_files(slot_dirs(config), session_path(config, name))
        shutil.rmtree(root, ignore_errors=True)
    return rows


def with_servers(config: cfg.Config, servers: Sequence[str]) -> cfg.Config:
    """``config`` with the MCP servers of SERVERS (file names) as hosts of its own, each run
    by this Python."""
    if not servers:
        return config
    hosts = [{"name": Path(s).stem, "kind": "mcp", "command": [sys.executable, str(SERVERS / s)]}
             for s in servers]
    return config.replace("tools", hosts=hosts)


def _run_files(world: Any, files: Sequence[TaskFile], workspace: Path, timeout_s: float,
               restart: bool, way: str, names: list[str], rows: list[Row],
               say: Callable[[str], None]) -> None:
    """The sessions of ``files`` on ``world``, a row each turn (``run_tasks``)."""
    for f in files:
        for group in sessions(f.tasks):
            fill(workspace, f.workspace)
            name = f"eval-{group[0].id}-{int(time.time())}"
            names.append(name)
            session = world.session(name)
            for task in group:
                row, full = _run_one(world, session, task, workspace, timeout_s)
                if full and restart:  # a new session, as a person would start
                    name = f"eval-{task.id}-{int(time.time())}"
                    names.append(name)
                    session = world.session(name)
                    lost = row  # what the full session spent on it counts too
                    row, _ = _run_one(world, session, task, workspace, timeout_s)
                    row = dataclasses.replace(
                        row, restarted=True, processed=row.processed + lost.processed,
                        written=row.written + lost.written,
                        compactions=row.compactions + lost.compactions,
                        seconds=round(row.seconds + lost.seconds, 1))
                rows.append(dataclasses.replace(
                    row, file=f.name, workspace=f.workspace or "loopd", set=f.set,
                    way=way))
                say(_line(rows[-1]))
            world.close_sessions()


def fill(workspace: Path, name: str) -> None:
    """``workspace`` (same directory) holding a fresh copy of workspace ``name``, or of this
    repository's tracked files for "" (its git checkout; the whole tree but for .git and
    what .gitignore names, without git)."""
    for child in workspace.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()
    if name == "empty":
        return
    if name.startswith("package:"):
        _unpack(workspace, name.removeprefix("package:"))
        return
    if name:
        shutil.copytree(WORKSPACES / name, workspace, dirs_exist_ok=True)
        return
    for rel in _repo_files():
        target = workspace / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, target, follow_symlinks=False)


def _unpack(workspace: Path, name: str) -> None:
    """An installed package laid out as its sdist has it: the package's folder (without
    compiled files), PKG-INFO (its metadata as installed) and README.md (the long
    description in that metadata). Built at run time: no third-party code is committed."""
    import importlib.metadata

    source = _package_dir(name)
    if source is None:
        raise ValueError(f"package {name!r} is not installed")
    shutil.copytree(source, workspace / name,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.so"))
    meta = importlib.metadata.distribution(name).read_text("METADATA") or ""
    (workspace / "PKG-INFO").write_text(meta, encoding="utf-8")
    _, _, body = meta.partition("\n\n")
    if body.strip():
        (workspace / "README.md").write_text(body.lstrip(), encoding="utf-8")


def _repo_files() -> list[str]:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True,
                             check=True).stdout.decode()
        return [p for p in out.split("\0") if p and (ROOT / p).is_file()]
    except (OSError, subprocess.CalledProcessError):
        skip = {".git", ".venv", "bench", "node_modules", "__pycache__", ".mypy_cache"}
        return sorted(str(p.relative_to(ROOT)) for p in ROOT.rglob("*")
                      if p.is_file() and not skip & set(p.relative_to(ROOT).parts))


def _run_one(
    world: Any, session: Any, task: Task, workspace: Path, timeout_s: float
) -> tuple[Row, bool]:
    """One turn's row, and whether it failed for a full context (SessionFull)."""
    cancel = CancelToken()
    timer = threading.Timer(timeout_s, cancel.cancel)
    started = time.monotonic()
    answer: str | None = None
    error: str | None = None
    full = False
    before = len(session.records().get())
    done: list[Compacted] = []  # a summary request writes no Usage record: its tokens are here
    sink = lambda e: done.append(e) if isinstance(e, Compacted) else None  # noqa: E731
    timer.start()
    try:
        outcome = session.turn(world.runtime, task.prompt, sink, cancel,
                               _Harness(task.approve)).get()
        answer = outcome.content
        if outcome.cut:
            error = "cut"  # why: the turn's Cut record, below
    except LoopdError as e:
        error = f"timeout after {timeout_s:g} s" if cancel.cancelled else f"{type(e).__name__}: {e}"
        full = isinstance(e, SessionFull)
    finally:
        timer.cancel()
    seconds = time.monotonic() - started
    records = session.records().get()
    turn = _this_turn(records)
    if error == "cut":  # the runaway watch's, a timeout's, or max_tokens (no Cut record)
        error = next((r.note for r in reversed(turn) if isinstance(r, Cut)),
                     "cut at loop.max_tokens")
    config = world.runtime.config
    children = children_of(turn, lambda name: read_records(session_path(config, name)))
    passed, why = score(task, answer, error, turn, workspace, children=children)
    added = [*records[before:], *(r for log in children for r in log)]  # a compaction
    # before the turn's User record counts too; so does what its agents processed
    return Row(
        task=task.id, kind=task.kind, passed=passed,
        tool_calls=len(calls_of(turn)) + sum(len(calls_of(log)) for log in children),
        prompt_tokens=sum(r.prompt_tokens for r in turn if isinstance(r, Usage)),
        seconds=round(seconds, 1), why=why, answer=(answer or "")[:300],
        transcript=tuple(_transcript(turn)),
        processed=sum(processed(r) for r in added if isinstance(r, Usage))
        + sum(c.processed for c in done),
        compactions=sum(isinstance(r, Compaction) for r in added),
        written=sum(c.generated for c in done),
    ), full


def processed(usage: Usage) -> int:
    """The prompt tokens the server processed for one response (llama-server's prompt_n:
    the prompt less what its cache held); the whole prompt when the server did not say."""
    n = usage.timings.get("prompt_n")
    return int(n) if isinstance(n, int | float) else usage.prompt_tokens


def _transcript(records: Sequence[Record]) -> list[str]:
    """What the model said and the tools answered in one turn, a short line each."""
    lines: list[str] = []
    for r in records:
        if isinstance(r, Assistant):
            lines += [f"  call {c.name} {c.arguments}" for c in r.tool_calls]
            if r.content:
                lines.append(f"  says {' '.join(r.content.split())[:160]!r}")
        elif isinstance(r, ToolResult):
            lines.append(f"  result {' '.join(r.content.split())[:160]!r}")
    return lines


class _Harness:
    """The eval's approver: yes once for a task that says approve, else no (with why)."""

    def __init__(self, approve: bool) -> None:
        self.approve = approve

    def __call__(self, request: Any, cancel: CancelToken, deadline: float) -> Decision:
        if self.approve:
            return Decision(Choice.ONCE, by="eval harness")
        return Decision(Choice.DENY, "this task does not approve it", by="eval harness")


def _this_turn(records: Sequence[Record]) -> list[Record]:
    starts = [i for i, r in enumerate(records) if isinstance(r, User)]
    return list(records[starts[-1]:]) if starts else list(records)


def _line(row: Row) -> str:
    mark = "pass" if row.passed else "FAIL"
    answer = " ".join(row.answer.split())[:100]
    return f"{row.task}: {mark} ({row.tool_calls} calls, {row.seconds:.0f} s) {row.why}: {answer!r}"


# --- output --------------------------------------------------------------------------------


def pass_rate(rows: Sequence[Row]) -> float:
    return sum(r.passed for r in rows) / len(rows) if rows else 0.0


@dataclasses.dataclass(frozen=True, slots=True)
class Tally:
    """Passed turns of a group of rows: a task file, a set, a kind, or all."""

    group: str
    passed: int
    tasks: int

    @property
    def rate(self) -> float:
        return self.passed / self.tasks if self.tasks else 0.0

    def __str__(self) -> str:
        return f"{self.passed}/{self.tasks} ({self.rate:.0%})"


def summary(rows: Sequence[Row]) -> dict[str, list[Tally]]:
    """The pass counts per task file, per set, per set and kind, and overall (the tuned and
    never-tuned sets: the repository and the long chats are reported apart)."""

    def tally(name: str, group: Iterable[Row]) -> Tally:
        got = list(group)
        return Tally(name, sum(r.passed for r in got), len(got))

    files = list(dict.fromkeys(r.file for r in rows))
    sets = [s for s in SETS if any(r.set == s for r in rows)]
    kinds = list(dict.fromkeys(r.kind for r in rows))
    return {
        "file": [tally(f"{f} ({next(r.workspace for r in rows if r.file == f)}, "
                       f"{next(r.set for r in rows if r.file == f)})",
                       (r for r in rows if r.file == f)) for f in files],
        "set": [tally(s, (r for r in rows if r.set == s)) for s in sets],
        "kind": [tally(f"{k} ({s})", rows_k) for s in sets for k in kinds
                 if (rows_k := [r for r in rows if r.set == s and r.kind == k])],
        "overall": [tally(" + ".join(s for s in OVERALL if s in sets) or "none",
                          (r for r in rows if r.set in OVERALL))],
    }


def table(rows: Sequence[Row]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if not console.is_terminal:
        console = Console(width=200)
    t = Table(title=f"loopd eval: {sum(r.passed for r in rows)}/{len(rows)} turns passed")
    for col in ("task", "file", "kind", "pass", "tool calls", "prompt tokens", "time (s)",
                "why"):
        t.add_column(col, justify="right" if col in ("tool calls", "prompt tokens", "time (s)")
                     else "left")
    for r in rows:
        t.add_row(r.task, r.file, r.kind, "yes" if r.passed else "[red]no[/]", str(r.tool_calls),
                  f"{r.prompt_tokens:,}", f"{r.seconds:.1f}", r.why[:90])
    console.print(t)
    for group, tallies in summary(rows).items():
        s = Table(title=f"per {group}" if group != "overall" else "overall")
        s.add_column(group)
        s.add_column("passed", justify="right")
        for tally in tallies:
            s.add_row(tally.group, str(tally))
        console.print(s)


def write_json(rows: Sequence[Row], out: Path, meta: Mapping[str, Any]) -> None:
    """The rows and their summary (set overflow's rows apart: ``meta["overflow"]``)."""
    out.parent.mkdir(exist_ok=True)
    everything, rows = rows, [r for r in rows if not r.way]
    body = {
        "meta": {
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "python": platform.python_version(), "machine": platform.machine(), **meta,
            "pass_rate": round(pass_rate(rows), 3),
            "passed": sum(r.passed for r in rows), "tasks": len(rows),
            "summary": {group: [{"group": t.group, "passed": t.passed, "tasks": t.tasks}
                                for t in tallies]
                        for group, tallies in summary(rows).items()},
        },
        "rows": [{"bench": "eval", **dataclasses.asdict(r)} for r in everything],
    }
    out.write_text(json.dumps(body, indent=2) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="make eval", description=__doc__.splitlines()[0])
    p.add_argument("ids", nargs="*", help="run only these tasks (and the earlier tasks of "
                   "their sessions)")
    p.add_argument("--config", help="a config file instead of a new user's defaults")
    p.add_argument("--tasks", action="append", default=[], metavar="FILE",
                   help="a task file (again for more); default: every file of examples/eval")
    p.add_argument("--set", action="append", default=[], choices=SETS,
                   help="only the files of this set (again for more)")
    p.add_argument("--out", default=str(OUT), help="where the JSON goes")
    p.add_argument("--timeout", type=float, default=TASK_TIMEOUT_S,
                   help="seconds per turn (raise it on a loaded machine rather than count "
                   "timeouts as failures)")
    p.add_argument("--seed", type=int, default=SEED, help="sampling seed; -1: the default")
    p.add_argument("--way", action="append", default=[], metavar="WAY",
                   help="set overflow: a way on past the context (summary, elide, new-session; "
                   "NAME@0.5 also sets session.compact_at), again for more; default: all three")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="print each turn's calls, results and answers")
    args = p.parse_args(argv)
    try:
        files = [load_file(Path(t)) for t in args.tasks] if args.tasks else task_files()
        files = chosen(files, args.set, args.ids, named=bool(args.tasks))
    except ValueError as e:
        p.error(str(e))
    from scripts import eval_overflow

    base = cfg.load(args.config) if args.config else cfg.Config()
    ways = args.way or list(eval_overflow.WAYS)
    try:
        for way in ways:
            eval_overflow.way_config(base, way)
    except ValueError as e:
        p.error(str(e))
    started = time.monotonic()
    say: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    plain = [f for f in files if f.set != "overflow"]
    rows = run_tasks(plain, base, timeout_s=args.timeout, seed=args.seed, say=say) if plain else []
    long = [f for f in files if f.set == "overflow"]
    overflow = eval_overflow.run_overflow(long, base, ways, timeout_s=args.timeout,
                                          seed=args.seed, say=say) if long else []
    if args.verbose:
        for row in [*rows, *overflow]:
            print("\n".join((f"{row.task}{f' ({row.way})' if row.way else ''}: "
                             f"{'pass' if row.passed else 'FAIL'}", *row.transcript)))
    if rows:
        table(rows)
        overall = summary(rows)["overall"][0]
        print(f"overall ({overall.group}): {overall}")
    if overflow:
        eval_overflow.table(overflow)
    print(f"in {time.monotonic() - started:.0f} s")
    write_json([*rows, *overflow], Path(args.out), {
        "config": args.config or "defaults", "seed": args.seed, "timeout_s": args.timeout,
        **({"overflow": eval_overflow.summary_json(overflow)} if overflow else {}),
    })
    print(f"written {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
