"""client.py started warm: one Python with loopd's MCP client imported, a fork per scenario.

Importing the MCP SDK (its pydantic types) costs a second of CPU, more than a scenario's own
work; the suite starts the client 26 times. ``python warm.py serve SOCKET`` imports client.py
once and waits; the suite's command is ``python -I -S warm.py SOCKET`` (a bare interpreter, no
site, no loopd: a few milliseconds), which hands its argv, environment, working folder and
stdin/stdout/stderr to the server over the Unix socket and exits with the code it gets back.
The server forks a child per command that takes those over and runs ``client.run`` as a
fresh ``python client.py URL`` would. At most ``AT_ONCE`` clients run together, the others
wait in the socket's backlog: the suite starts its scenarios all at once, and one of them
(``sse-retry``) checks the client's timing, which 26 clients at once on 2 cores would spoil.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
from collections.abc import Callable

AT_ONCE = 2
_MAX_MESSAGE = 1 << 20


def launch(path: str, argv: list[str]) -> int:
    """The suite's command: this process's argv, environment, folder and stdio to the server."""
    message = json.dumps({"argv": argv, "env": dict(os.environ), "cwd": os.getcwd()}).encode()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(path)
        socket.send_fds(conn, [len(message).to_bytes(4, "big") + message], [0, 1, 2])
        code = conn.recv(4)
    if len(code) != 4:
        print("warm: the client ended without an exit code (killed?)", file=sys.stderr)
        return 1
    return int.from_bytes(code, "big", signed=True)


def serve(path: str) -> None:
    """Accept commands, a fork each, at most AT_ONCE running; until killed."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import client  # the import the forks share

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    print("warm: ready", flush=True)
    running = 0
    while True:
        while running >= AT_ONCE:
            os.wait()
            running -= 1
        conn, _ = listener.accept()
        if os.fork() == 0:
            listener.close()
            os._exit(_child(conn, client.run))
        conn.close()
        running += 1
        while running and os.waitpid(-1, os.WNOHANG)[0]:  # reap the ones already done
            running -= 1


def _child(conn: socket.socket, run: Callable[[list[str]], int]) -> int:
    code = 1
    try:
        head, fds, _, _ = socket.recv_fds(conn, _MAX_MESSAGE, 3)
        size = int.from_bytes(head[:4], "big")
        body = head[4:]
        while len(body) < size:
            body += conn.recv(size - len(body))
        command = json.loads(body)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.environ.clear()
        os.environ.update(command["env"])
        os.chdir(command["cwd"])
        sys.argv = ["client.py", *command["argv"]]
        code = run(command["argv"])
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:  # said on the client's stderr, as Python would
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        with contextlib.suppress(OSError):  # the command is gone (the suite's timeout)
            conn.sendall(code.to_bytes(4, "big", signed=True))
    return code


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(sys.argv[2])
    else:
        sys.exit(launch(sys.argv[1], sys.argv[2:]))
