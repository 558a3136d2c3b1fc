"""The session process's side of the tool wire: a port per tool host, its connection and
its calls.

- ``settings``: how to reach a host (endpoint, limits, CURVE keys) and the socket options;
- ``connection``: the thread that says Hello, pings, and gives up on a silent host;
- ``calls``: one call on the calling thread's own socket, and every failure text;
- ``supervisor``: the actor that starts, restarts and stops a local host process;
- ``tool_port``: :class:`ToolPort`, what a session holds, and ``start_port`` / ``stop_ports``.
"""

from actors.tools.port.connection import PortState
from actors.tools.port.settings import PORT_GRACE_S, CurveClient, PortSettings
from actors.tools.port.supervisor import HostLauncher, PortStatus
from actors.tools.port.tool_port import ToolPort, start_port, stop_ports
from actors.tools.protocol.wire import Questions

__all__ = [
    "PORT_GRACE_S",
    "CurveClient",
    "HostLauncher",
    "PortSettings",
    "PortState",
    "PortStatus",
    "Questions",
    "ToolPort",
    "start_port",
    "stop_ports",
]
