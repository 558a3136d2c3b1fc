"""Tools in their own processes, reached over ZeroMQ.

- ``wire``: the messages between a tool port and a tool host, and their msgpack codec;
- ``host``: the tool host process (``loopd toolhost``), a ROUTER with a worker per call;
- ``port``: the tool port (a pykka actor, its I/O thread, and the handle sessions call);
- ``registry``: find_tool / call_tool, and ``dispatch`` of a model's tool call;
- ``supervisor``: the ``Toolbox`` that starts, restarts and stops the hosts;
- ``standard``, ``workspace``, ``command``, ``web``: the standard tools and their rules;
- ``procs``: killing process trees and sessions; ``keys``: CURVE keys (``loopd keys``);
- ``spec``: what a host offers and the ToolProvider contract; ``mcp``: MCP servers as providers.
"""

__all__: list[str] = []
