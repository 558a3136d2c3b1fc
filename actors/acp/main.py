"""``loopd acp``: run the ACP agent on this process's stdin and stdout until the input ends.

The CLI parses the common flags and calls :func:`serve`. From here on stdout belongs to the
protocol alone (:func:`actors.acp.stdio.claim_stdio`); everything for a person goes to
stderr. The input's end, SIGTERM or SIGINT end it the same way: turns in flight are
cancelled (their logs stay valid), the requests already read are answered, the backend is
closed (KV state saved, the embedded server and the tool hosts stopped), exit 0.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from pathlib import Path
from typing import cast

from acp.agent.connection import AgentSideConnection
from acp.interfaces import Agent
from acp.meta import AGENT_METHODS
from acp.router import MessageRouter
from acp.schema import DeleteSessionRequest
from acp.utils import normalize_result

from actors.acp.agent import LoopdAgent
from actors.acp.stdio import StdioTransport, claim_stdio
from actors.base import startup
from actors.base.config import Config

__all__ = ["route_delete", "serve"]


def _say(text: str) -> None:
    print(f"loopd acp: {text}", file=sys.stderr, flush=True)


def serve(config: Config, *, local: bool = False, workspace: Path | None = None) -> int:
    """Serve one ACP client on stdin/stdout. ``local``: never use a daemon; ``workspace``:
    every session's workspace, whatever the ``cwd`` its ``session/new`` names."""
    read_fd, write_fd = claim_stdio()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="loopd acp: %(name)s: %(message)s")
    return asyncio.run(_serve(config, read_fd, write_fd, local, workspace))


async def _serve(
    config: Config, read_fd: int, write_fd: int, local: bool, workspace: Path | None
) -> int:
    agent = LoopdAgent(config, local=local, workspace=workspace, say=_say)
    transport = StdioTransport(read_fd, write_fd, on_end=agent.wind_down,
                               on_message=agent.saw, following=agent.following)
    agent.notify = transport.send  # what the pinned SDK cannot express (compaction updates)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, transport.end)
    try:
        # session/fork, resume and close are among the pinned SDK's unstable methods
        conn = AgentSideConnection(cast(Agent, agent), transport, listening=False,
                                   use_unstable_protocol=True)
        agent.can_delete = route_delete(conn, agent)
        startup.settled()
        try:
            await conn.listen()
        finally:
            await asyncio.shield(conn.close())
    finally:
        await agent.aclose()
        await transport.close()
    return 0


def route_delete(conn: AgentSideConnection, agent: LoopdAgent) -> bool:
    """Route ``session/delete`` (stable ACP) to ``agent.delete_session``: the pinned SDK
    (0.12.1) has its request and response types but routes no handler for it. False when
    the connection is not built as this SDK builds it: then it is not declared either."""
    router = getattr(getattr(conn, "_conn", None), "_handler", None)
    if not isinstance(router, MessageRouter):
        return False
    router.route_request(AGENT_METHODS["session_delete"], DeleteSessionRequest, agent,
                         "delete_session", adapt_result=normalize_result)
    return True
