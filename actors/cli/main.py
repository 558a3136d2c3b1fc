"""The ``loopd`` command.

Exit codes say what happened: 0 answered, else the ``exit_code`` of the
:class:`~actors.base.errors.LoopdError` that ended the command (2 bad usage or config, 3 a limit
ended the turn, 4 the model server failed, 5 the session cannot be used, 130 cancelled).
Only LoopdError is caught here: anything else is a bug, and shows its traceback.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from rich.console import Console
from rich.markup import escape

from actors.base import config as cfg
from actors.base import startup
from actors.base.errors import DaemonError, LoopdError, SessionFull, UsageError
from actors.base.events import Approver
from actors.cli import branch, compact
from actors.cli.approvers import JsonApprover, NoTerminal, TerminalApprover
from actors.cli.chat import Chat, line_reader, run_chat
from actors.cli.chat_commands import COMMANDS
from actors.cli.conversation import open_conversation
from actors.cli.fullness import size_note, ways_on
from actors.cli.terminal import ReaderGone, SafeConsole, json_line, quiet, visible
from actors.cli.view import JsonView, LiveView, describe, summary, torn_tail_left
from actors.log.file import read_log
from actors.log.records import Compaction, Forked, Rewind, User, kind_of, to_json
from actors.log.sessiondir import kept_workspace, list_sessions, session_path
from actors.session.agents import parent_of, under_parents
from actors.session.limits import shown_tokens
from actors.session.messages import turn_of, view

__all__ = ["main"]

OK, CANCELLED = 0, 130
_STOP_WAIT_S = 120  # `loopd stop`: turns wind down, KV state is saved, hosts stop


_LOCAL = ("run in this process even when a daemon (loopd serve) answers (--url, --workspace "
          "and --log-dir do this too)")


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", help="TOML config file (default: $LOOPD_CONFIG or built-in)")
    common.add_argument("--url", help="llama-server URL (overrides inference.url)")
    common.add_argument("--workspace", help="root of the file tools (overrides tools.workspace)")
    common.add_argument("--log-dir", help="where sessions live (overrides log.dir)")

    p = argparse.ArgumentParser(prog="loopd", description="Conversations with a local model.")
    p.add_argument("--version", action="version", version=f"loopd {_version()}")
    sub = p.add_subparsers(dest="command", required=True)
    _conversation_commands(sub, common)
    _daemon_commands(sub, common)
    _session_commands(sub, common)
    sub.add_parser("toolhost", help="run a tool host (see: loopd toolhost --help)", add_help=False)
    sub.add_parser("keys", help="make a CURVE key pair (see: loopd keys --help)", add_help=False)
    return p


def _conversation_commands(sub: Any, common: argparse.ArgumentParser) -> None:
    """``chat`` and ``run``: a turn, or turns, with the model."""
    approve = argparse.ArgumentParser(add_help=False)
    approve.add_argument(
        "--approve", action="append", default=[], metavar="TOOL[:PREFIX]",
        help="let calls this rule matches run without asking, in this command only (like "
        "tools.allow; e.g. --approve 'run_command:git status'); may be repeated",
    )
    chat = sub.add_parser("chat", parents=[common, approve],
                          help="talk with the model, turn by turn")
    chat.add_argument("--session", default="default", help="session name (default: default)")
    chat.add_argument("--local", action="store_true", help=_LOCAL)
    chat.set_defaults(usage=chat)
    run = sub.add_parser("run", parents=[common, approve],
                         help="one turn: the answer on stdout")
    run.add_argument("message")
    run.add_argument("--session", default="default", help="session name (default: default)")
    run.add_argument("--json", action="store_true",
                     help="print the events as JSON lines; approvals are answered with a JSON "
                     'line on stdin, e.g. {"decision": "once"}')
    run.add_argument("--local", action="store_true", help=_LOCAL)
    run.set_defaults(usage=run)


def _daemon_commands(sub: Any, common: argparse.ArgumentParser) -> None:
    """``serve``, ``acp``, ``status`` and ``stop``: the processes that serve sessions."""
    serve = sub.add_parser("serve", parents=[common], help="run the daemon: sessions stay warm")
    serve.add_argument("--detach", action="store_true", help="run it in the background")
    serve.set_defaults(usage=serve)
    acp = sub.add_parser(
        "acp", parents=[common],
        help="an Agent Client Protocol agent on stdin/stdout, for editors (Zed, JetBrains, "
        "Neovim): see the README",
    )  # fmt: skip
    acp.add_argument("--local", action="store_true", help=_LOCAL)
    acp.set_defaults(usage=acp)
    status = sub.add_parser("status", parents=[common], help="what the daemon is doing")
    status.set_defaults(usage=status)
    stop = sub.add_parser("stop", parents=[common], help="stop the daemon")
    stop.set_defaults(usage=stop)


def _session_commands(sub: Any, common: argparse.ArgumentParser) -> None:
    """``sessions`` (``rm``, ``fork``), ``rewind``, ``compact`` and ``log show``."""
    sessions = sub.add_parser("sessions", parents=[common], help="list the sessions")
    sessions.set_defaults(usage=sessions)
    sessions.add_argument("--json", action="store_true",
                          help="one JSON object per session: name, tokens, context, workspace")
    sessions_sub = sessions.add_subparsers(dest="sessions_command")
    rm = sessions_sub.add_parser(
        "rm", parents=[common], help="delete a session: its log and its saved KV state"
    )
    rm.add_argument("name")
    rm.set_defaults(usage=rm)
    fork = sessions_sub.add_parser(
        "fork", parents=[common],
        help="a new session from another's conversation (all of it, or up to a turn) and its "
        "KV state: the branch's first message is processed alone",
    )  # fmt: skip
    fork.add_argument("source", help="the session to fork (it is not changed)")
    fork.add_argument("name", help="the new session's name")
    fork.add_argument("--at", type=int, metavar="TURN",
                      help="fork after this turn of the source (turn N: its N-th message; "
                      "default: all of it; loopd log show numbers them)")
    fork.add_argument("--local", action="store_true", help=_LOCAL)
    fork.set_defaults(usage=fork)
    rewind = sub.add_parser(
        "rewind", parents=[common],
        help="take back a session's last turn(s): they stay in its log, the conversation "
        "goes on from before them (warm)",
    )  # fmt: skip
    rewind.add_argument("session")
    rewind.add_argument("--turns", type=int, default=1, help="how many (default: 1)")
    rewind.add_argument("--local", action="store_true", help=_LOCAL)
    rewind.set_defaults(usage=rewind)
    compact_ = sub.add_parser(
        "compact", parents=[common],
        help="shorten a session's conversation now: a summary and its last turns (the log "
        "keeps every record; session.compaction says how)",
    )  # fmt: skip
    compact_.add_argument("session")
    compact_.add_argument("--local", action="store_true", help=_LOCAL)
    compact_.set_defaults(usage=compact_, approve=[])
    log = sub.add_parser("log", help="read a session's log")
    log_sub = log.add_subparsers(dest="log_command", required=True)
    show = log_sub.add_parser("show", parents=[common], help="every record of a session")
    show.add_argument("session")
    show.add_argument("--json", action="store_true", help="one JSON object per record")
    show.set_defaults(usage=show)


def _version() -> str:
    """This loopd's version: the installed package's, else the source tree's pyproject.toml."""
    from importlib import metadata

    try:
        return metadata.version("loopd")
    except metadata.PackageNotFoundError:
        import tomllib
        from pathlib import Path

        project = Path(__file__).resolve().parents[2] / "pyproject.toml"
        try:
            return str(tomllib.loads(project.read_text(encoding="utf-8"))["project"]["version"])
        except (OSError, KeyError, tomllib.TOMLDecodeError):
            return "(version not known: not installed)"


def _parse(argv: list[str]) -> argparse.Namespace:
    """The command line; an unknown argument is reported with the usage of the command it
    was given to (``loopd run ... --sesion x`` shows ``loopd run``'s usage, not loopd's)."""
    parser = _parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        getattr(args, "usage", parser).error(f"unrecognized arguments: {' '.join(unknown)}")
    args.argv = argv
    return args


def console(*, stderr: bool = False) -> Console:
    """A rich console that never breaks a line itself: the terminal wraps a long URL or
    path where it must, and a file or pipe gets every line whole."""
    return SafeConsole(stderr=stderr, soft_wrap=True)


def _load(args: argparse.Namespace) -> cfg.Config:
    """The config with the command's options in place of the file's keys (before "auto" is
    resolved: --url decides whether the embedded model runs)."""
    overrides: dict[str, dict[str, Any]] = {}
    if args.url:
        overrides["inference"] = {"url": args.url, "servers": []}
    if args.workspace:
        overrides["tools"] = {"workspace": args.workspace}
    if args.log_dir:
        overrides["log"] = {"dir": args.log_dir}
    return cfg.load(args.config, overrides)


def main(argv: Sequence[str] | None = None) -> int:
    if argv is None:  # the program's own command line: a loopd process (not a test's call)
        startup.program()
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["toolhost"]:
        from actors.tools.host import main as toolhost

        return toolhost(argv[1:])
    if argv[:1] == ["keys"]:
        from actors.wire.curve import main as keys

        return keys(argv[1:])
    args = _parse(argv)
    err = console(stderr=True)
    # SIGTERM ends the command like Ctrl-C does: the turn is cancelled, the embedded
    # server and the tool hosts are stopped on the way out.
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _terminate)
    try:
        config = _load(args)
        command: Callable[[argparse.Namespace, cfg.Config, Console], int] = _COMMANDS[
            args.command if args.command != "log" else "log_show"
        ]
        return command(args, config, err)
    except ReaderGone:  # `loopd run --json | head`: the turn was cancelled, quietly
        return CANCELLED
    except KeyboardInterrupt:
        err.print("[yellow]cancelled[/]")
        return CANCELLED
    except BrokenPipeError:  # stdout's reader went away (`loopd sessions | head`): quietly
        quiet(sys.stdout)
        return OK
    except LoopdError as e:
        err.print(f"[red]loopd: {escape(str(e))}[/]", highlight=False, soft_wrap=True)
        return e.exit_code


class Terminated(KeyboardInterrupt):
    """SIGTERM: like Ctrl-C for the turn in flight, but it ends the command too (chat's
    prompt and a turn's wait re-raise it where a plain Ctrl-C is taken as "cancel this")."""


def _terminate(signum: int, frame: Any) -> None:
    raise Terminated


# --- commands --------------------------------------------------------------------------


def _sessions(args: argparse.Namespace, config: cfg.Config, err: Console) -> int:
    if args.sessions_command == "fork":
        return branch.fork(args, config, err)
    if args.sessions_command == "rm":
        from actors.service.local import remove_session  # its KV state's files too

        remove_session(config, args.name)
        err.print(f"session {args.name} deleted")
        return OK
    names = list_sessions(config)
    # The context a slot holds is known offline for the embedded model only (its ctx_size).
    context = config.embedded.ctx_size if config.embedded_model else 0
    logs = {n: read_log(session_path(config, n), name=n)[0] for n in names}
    for name, depth in under_parents(logs):  # an agent's session under its parent
        used = shown_tokens(logs[name])  # after a compaction: its estimate (was 0)
        workspace = kept_workspace(config, name)
        parent = parent_of(name, logs[name])
        if args.json:
            print(json_line({"name": name, "tokens": used, "context": context,
                             "workspace": str(workspace or "")}
                            | ({"parent": parent} if parent else {})))
            continue
        share = f" of {context:,} ({used / context:.0%})" if context else ""
        print(visible("  " * depth + f"{name}  {used:,} tokens{share}"
                      + (f"  {workspace}" if workspace else "")))
    if not names:
        err.print(f"no sessions in {escape(str(config.log_dir))}")
    return OK


def _log_show(args: argparse.Namespace, config: cfg.Config, err: Console) -> int:
    records, torn = read_log(session_path(config, args.session), name=args.session)
    if torn:
        err.print(f"[yellow]{escape(torn_tail_left(args.session, torn))}[/]", highlight=False,
                  soft_wrap=True)
    if args.json:
        for r in records:
            print(json_line(to_json(r)))
        return OK
    out = console()
    marks = {r.kept: n for n, r in enumerate(records, 1) if isinstance(r, Compaction)}
    turns, shown = turn_of(records), set(view(records).turns)
    for i, r in enumerate(records, 1):
        if i - 1 in marks:  # where a compaction's verbatim part starts
            out.print(f"[dim]     ── from here on sent verbatim after the compaction at "
                      f"#{marks[i - 1]} ──[/]", highlight=False)
        when = r.time.strftime("%Y-%m-%d %H:%M:%S")
        kind = kind_of(r)
        turn = turns[i - 1]
        rewound = turn and turn not in shown and not isinstance(r, Rewind | Forked)
        out.print(f"[dim]{i:>4} {when}[/] [bold]{kind:<11}[/] "
                  + ("[yellow](rewound)[/] " if rewound else "")
                  + (f"[dim]turn {turn}:[/] " if isinstance(r, User) else ""),
                  end="", highlight=False)
        out.print(describe(r), markup=False, highlight=False)
    return OK


def _run(args: argparse.Namespace, config: cfg.Config, err: Console) -> int:
    out = console()
    json_view = JsonView(sys.stdout) if args.json else None
    # Where the answer streams: stdout on a terminal; stderr while stdout is piped, so the
    # person sees it come (stdout gets it whole at the end); nowhere when stderr is not a
    # terminal either: stdout's copy is the one (both piped printed it twice).
    live = LiveView(err, answer=out if out.is_terminal else err,
                    stream=err.is_terminal or out.is_terminal)
    sink: Any = json_view or live
    status = (lambda s: json_view.line(getattr(s, "event", None) or {"event": "status", "text": s})
              ) if json_view else (
        lambda s: err.print(f"[dim]{escape(s)}[/]")
    )
    approver: Approver = (
        JsonApprover(json_view.line) if json_view
        else TerminalApprover(err) if sys.stdin.isatty() else NoTerminal()
    )
    with open_conversation(args, config, status, sink, approver) as conversation:
        startup.settled()
        started = time.monotonic()
        try:
            outcome = conversation.turn(args.message, sink)
        except LoopdError as e:
            live.finish()
            if json_view:
                json_view.line({"event": "error", "kind": type(e).__name__, "message": str(e)})
            else:
                err.print(f"[red]{escape(str(e))}[/]", highlight=False, soft_wrap=True)
                if isinstance(e, SessionFull):
                    err.print(f"[yellow]{escape(ways_on(args.session, _COMMANDS, chat=False))}"
                              "[/]", highlight=False)
            return e.exit_code
        live.finish()
        line = summary(outcome, time.monotonic() - started)
        used = outcome.usage.prompt_tokens + outcome.usage.completion_tokens
        context = outcome.context or conversation.context()
        if json_view:  # tokens of context (0: not known): a script sees how full it is
            json_view.line({"event": "answer", "content": outcome.content, "cut": outcome.cut,
                            "summary": line, "tokens": used, "context": context})
            return OK
        if live.answer is err:
            print(visible(outcome.content))
        err.print(f"[dim]{line}[/]")
        note = size_note(args.session, used, context, _COMMANDS, chat=False)
        if note is not None:
            err.print(f"[yellow]{escape(note)}[/]", highlight=False)
        return OK


def _chat(args: argparse.Namespace, config: cfg.Config, err: Console) -> int:
    out = console()
    notices = LiveView(out)
    approver: Approver = TerminalApprover(out) if sys.stdin.isatty() else NoTerminal()
    with open_conversation(args, config, lambda s: err.print(f"[dim]{escape(s)}[/]"), notices,
                           approver) as conversation:
        startup.settled()
        # Ctrl-C at the prompt clears the line; SIGTERM (Terminated) ends the chat
        run_chat(Chat(conversation, out, COMMANDS), line_reader(),
                 lambda e: not isinstance(e, Terminated))
    return OK


# --- the daemon ------------------------------------------------------------------------


class _VisibleFormatter(logging.Formatter):
    """A log line on the terminal with its control characters shown (terminal.visible)."""

    def format(self, record: logging.LogRecord) -> str:
        return visible(super().format(record))


def _serve(args: argparse.Namespace, config: cfg.Config, err: Console) -> int:
    from actors.daemon.client import find_daemon
    from actors.daemon.server.main import detach, serve

    if not args.detach:
        shown = logging.StreamHandler(sys.stderr)  # a log line quotes what clients sent
        shown.setFormatter(_VisibleFormatter("%(asctime)s %(name)s %(message)s"))
        logging.basicConfig(level=logging.INFO, handlers=[shown])
        logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per request
        return serve(config, lambda s: err.print(f"[dim]{escape(s)}[/]", highlight=False))
    running = find_daemon(config)
    if running is not None:
        with running:
            pid = running.status().pid
        raise UsageError(f"a loopd daemon is already running (pid {pid}); `loopd stop` ends it")

    def answers() -> bool:
        client = find_daemon(config)
        if client is not None:
            client.close()
        return client is not None

    # The workspace the config or --workspace names, resolved here and passed on: the
    # daemon serves that folder whatever its own directory, and says which ("." is the
    # folder this command runs in; `loopd serve --detach` from the wrong folder served it).
    given = [a for a in args.argv[1:] if a != "--detach"]
    pid = detach([*given, "--workspace", str(config.workspace)], config, answers)
    err.print(f"loopd daemon started (pid {pid}) on workspace {config.workspace} "
              "(tools.workspace, or --workspace DIR)", highlight=False)
    return OK


def _acp(args: argparse.Namespace, config: cfg.Config, err: Console) -> int:
    """The editor's agent: sessions' ``cwd`` is the workspace unless --workspace names one;
    --url and --log-dir (a world of this command's own) keep it in this process."""
    from pathlib import Path

    from actors.acp.main import serve

    local = args.local or bool(args.url or args.log_dir)
    return serve(config, local=local, workspace=Path(config.workspace) if args.workspace
                 else None)


def _daemon(config: cfg.Config) -> Any:
    from actors.daemon.address import endpoint
    from actors.daemon.client import find_daemon

    client = find_daemon(config)
    if client is None:
        raise DaemonError(
            f"no loopd daemon answers at {endpoint(config)}; start one with `loopd serve`"
        )
    return client


def _status(args: argparse.Namespace, config: cfg.Config, err: Console) -> int:
    with _daemon(config) as client:
        s = client.status()
    others = max(0, s.clients - 1)  # this command is a client of it too
    lines = [f"loopd daemon pid {s.pid} on {s.endpoint}, up {s.uptime_s:.0f} s, "
             f"{others or 'no'} client{'s' if others != 1 else ''} besides this one",
             f"  workspace {s.workspace or '(not said)'}", f"  model {s.model or '(not said)'}"]
    lines += [f"  session {row['name']}: {'running a turn' if row['busy'] else 'attached'}"
              for row in s.sessions]
    print(visible("\n".join(lines)))  # the daemon's words: a server's, shown as text
    return OK


def _stop(args: argparse.Namespace, config: cfg.Config, err: Console) -> int:
    import psutil

    from actors.base.processes.trees import is_alive
    from actors.daemon.address import endpoint
    from actors.daemon.client import find_daemon

    running = find_daemon(config)
    if running is None:  # nothing to stop is not a failure (and not the model server's 4)
        err.print(f"no loopd daemon is running (none answers at {endpoint(config)}); "
                  "nothing to stop", highlight=False)
        return OK
    with running as client:
        pid = client.status().pid
        try:
            process = psutil.Process(pid)
        except psutil.Error:
            process = None
        client.stop()
    deadline = time.monotonic() + _STOP_WAIT_S
    while process is not None and is_alive(process):  # a zombie has stopped too
        if time.monotonic() > deadline:
            raise DaemonError(f"the loopd daemon (pid {pid}) did not stop within {_STOP_WAIT_S} s")
        time.sleep(0.05)
    err.print(f"loopd daemon (pid {pid}) stopped", highlight=False)
    return OK


_COMMANDS: dict[str, Callable[[argparse.Namespace, cfg.Config, Console], int]] = {
    "sessions": _sessions,
    "log_show": _log_show,
    "run": _run,
    "chat": _chat,
    "serve": _serve,
    "acp": _acp,
    "status": _status,
    "stop": _stop,
    "rewind": branch.rewind,
    "compact": compact.compact,
}


if __name__ == "__main__":
    sys.exit(main())
