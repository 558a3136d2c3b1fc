"""``loopd acp``: loopd as an Agent Client Protocol agent, for editors (docs/acp.md).

It runs in the ``loopd acp`` process only: the CLI starts it, nothing else imports it.
``stdio`` is the wire, ``updates`` the mapping of loopd's events and records to ACP,
``backend`` where turns run (the daemon or this process), ``agent`` the protocol's
methods, ``main`` the process.
"""
