"""Tools in their own processes, reached over ZeroMQ. Two processes share this folder:

- the tool host process (``loopd toolhost``): ``protocol`` (the wire, the specs, the
  provider contract, the workspace walk; shared with the session side), ``host`` (the
  server: a ROUTER with a worker per call) and ``providers`` (what runs the tools: the
  standard tools and their rules, the command sandbox, fetch_url, MCP servers);
- the session process: ``port`` (a port per tool host: its connection, its calls, the
  supervisor of a local host's process), ``registry`` (find_tool / call_tool and the
  ``dispatch`` of a model's tool call), ``search`` (find_tool's ranking) and ``toolbox``
  (starts the hosts, connects their ports, stops them all).

tests/test_layers.py keeps the host side from reaching anything of the session.
"""

__all__: list[str] = []
