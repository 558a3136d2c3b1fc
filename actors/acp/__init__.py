"""``loopd acp``: loopd as an Agent Client Protocol agent, for editors (docs/acp.md).

It runs in the ``loopd acp`` process only: the CLI starts it, nothing else imports it.
``stdio`` is the wire, ``updates`` the mapping of loopd's events and records to ACP,
``agent`` the protocol's methods over the session service (:mod:`actors.service`: the
daemon or this process), ``main`` the process.
"""
