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

from acp import run_agent
from acp.interfaces import Agent

from actors.acp.agent import LoopdAgent
from actors.acp.stdio import StdioTransport, claim_stdio
from actors.base.config import Config

__all__ = ["serve"]


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
    transport = StdioTransport(read_fd, write_fd, on_end=agent.wind_down)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, transport.end)
    try:
        # session/fork is one of the SDK's unstable methods (the others loopd does not have)
        await run_agent(cast(Agent, agent), transport, use_unstable_protocol=True)
    finally:
        await agent.aclose()
        await transport.close()
    return 0
