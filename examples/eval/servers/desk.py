"""An eval MCP server of a person's own: a help desk's tools, unrelated to each other and to
files (the weather, support tickets, unit conversion). Fixed data, so a turn can be scored.
Written with the official MCP SDK (``MCPServer``); run as ``python desk.py`` (stdio)."""

from __future__ import annotations

from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

READ_ONLY = ToolAnnotations(read_only_hint=True, open_world_hint=False)
CHANGES = ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=False)

WEATHER = {
    "oslo": "Oslo: light rain, 4 °C, wind 20 km/h from the north",
    "lyon": "Lyon: sunny, 18 °C, wind 5 km/h from the south",
    "paris": "Paris: cloudy, 12 °C, wind 10 km/h from the west",
    "bergen": "Bergen: heavy rain, 7 °C, wind 35 km/h from the west",
}
TICKETS = [
    {"id": 101, "title": "Printer on floor 2 jams", "status": "open", "owner": "Mira"},
    {"id": 102, "title": "VPN drops every hour", "status": "open", "owner": "Tomas"},
    {"id": 103, "title": "New laptop for Ana", "status": "closed", "owner": "Mira"},
    {"id": 104, "title": "Projector in room Cedar has no signal", "status": "open",
     "owner": "Jon"},
]
# metres per unit, and the temperature scales apart
LENGTHS = {"m": 1.0, "km": 1000.0, "mi": 1609.344, "mile": 1609.344, "miles": 1609.344,
           "ft": 0.3048, "feet": 0.3048, "in": 0.0254, "inch": 0.0254, "cm": 0.01}
KILOGRAMS = {"kg": 1.0, "g": 0.001, "lb": 0.45359237, "lbs": 0.45359237, "pound": 0.45359237,
             "pounds": 0.45359237, "oz": 0.028349523}

server = MCPServer("desk", version="1")


@server.tool(annotations=READ_ONLY)
def get_weather(city: str) -> str:
    """The weather now in a city: sky, temperature, wind."""
    found = WEATHER.get(city.strip().lower())
    return found or f"no weather station for {city!r}; known: Oslo, Lyon, Paris, Bergen"


@server.tool(annotations=READ_ONLY)
def list_tickets(status: str = "open") -> str:
    """Support tickets with a status (open, closed or all): id, title, owner."""
    rows = [t for t in TICKETS if status == "all" or t["status"] == status]
    lines = [f"#{t['id']} {t['title']} (owner {t['owner']}, {t['status']})" for t in rows]
    return f"{len(rows)} {status} tickets:\n" + "\n".join(lines) if rows else "no tickets"


@server.tool(annotations=CHANGES)
def create_ticket(title: str) -> str:
    """Open a new support ticket with a title; answers its id."""
    return f"created ticket #105: {title}"


@server.tool(annotations=READ_ONLY)
def convert_units(value: float, from_unit: str, to_unit: str) -> str:
    """Convert a length, weight or temperature between units (km, mi, m, ft, kg, lb, C, F)."""
    a, b = from_unit.strip().lower(), to_unit.strip().lower()
    temps = {"c", "f", "celsius", "fahrenheit"}
    if a in temps and b in temps:
        if a[0] == b[0]:
            return f"{value:g} {from_unit} = {value:g} {to_unit}"
        out = value * 9 / 5 + 32 if a[0] == "c" else (value - 32) * 5 / 9
        return f"{value:g} {from_unit} = {out:.1f} {to_unit}"
    for table in (LENGTHS, KILOGRAMS):
        if a in table and b in table:
            return f"{value:g} {from_unit} = {value * table[a] / table[b]:.2f} {to_unit}"
    return f"cannot convert {from_unit} to {to_unit}"


if __name__ == "__main__":
    server.run()
