"""An eval MCP server of a person's own: an office's small database and two unrelated tools
(currency rates, meeting rooms). Fixed data, so a turn can be scored. Written with the
official MCP SDK (``MCPServer``); run as ``python office.py`` (stdio)."""

from __future__ import annotations

import sqlite3

from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

READ_ONLY = ToolAnnotations(read_only_hint=True, open_world_hint=False)

RATES = {("EUR", "USD"): 1.08, ("USD", "EUR"): 0.93, ("GBP", "EUR"): 1.17,
         ("EUR", "GBP"): 0.85, ("USD", "JPY"): 151.2}
ROOMS = {"Cedar": "free until 15:00", "Maple": "booked 9:00-12:00 by Ana, then free",
         "Birch": "booked all day (training)"}


def _db() -> sqlite3.Connection:
    db = sqlite3.connect(":memory:", check_same_thread=False)  # tools run in worker threads
    db.executescript("""
        create table customers (id integer primary key, name text, city text);
        insert into customers values (7, 'Grace Lee', 'Lyon'), (42, 'Omar Haddad', 'Cairo'),
            (58, 'Lena Berg', 'Oslo');
        create table orders (id integer primary key, customer integer, total real, status text);
        insert into orders values (1, 42, 120.5, 'pending'), (2, 7, 80.0, 'shipped'),
            (3, 42, 15.25, 'pending'), (4, 58, 300.0, 'shipped'), (5, 7, 42.0, 'pending');
    """)
    return db


DB = _db()
server = MCPServer("office", version="1")


@server.tool(annotations=READ_ONLY)
def query_database(sql: str) -> str:
    """Run one read-only SQL query on the office database (tables: customers(id, name,
    city), orders(id, customer, total, status)); answers the rows."""
    if not sql.strip().lower().startswith("select"):
        return "only SELECT queries are allowed"
    try:
        cursor = DB.execute(sql)
    except sqlite3.Error as e:
        return f"SQL error: {e}"
    names = [d[0] for d in cursor.description or ()]
    rows = cursor.fetchmany(50)
    return "\n".join([", ".join(names), *(", ".join(map(str, r)) for r in rows)]) or "no rows"


@server.tool(annotations=READ_ONLY)
def find_customer(name: str) -> str:
    """Look a customer up by (part of) their name: id, name, city, and their orders."""
    rows = DB.execute("select id, name, city from customers where name like ?",
                      (f"%{name.strip()}%",)).fetchall()
    if not rows:
        return f"no customer named {name!r}"
    out = []
    for cid, cname, city in rows:
        orders = DB.execute("select id, total, status from orders where customer = ?",
                            (cid,)).fetchall()
        listed = "; ".join(f"order {o} {t:.2f} EUR {s}" for o, t, s in orders) or "no orders"
        out.append(f"customer {cid}: {cname}, {city}; {listed}")
    return "\n".join(out)


@server.tool(annotations=READ_ONLY)
def exchange_rate(from_currency: str, to_currency: str) -> str:
    """Today's exchange rate between two currencies (EUR, USD, GBP, JPY)."""
    key = (from_currency.strip().upper(), to_currency.strip().upper())
    rate = RATES.get(key)
    return f"1 {key[0]} = {rate} {key[1]}" if rate else f"no rate for {key[0]} to {key[1]}"


@server.tool(annotations=READ_ONLY)
def room_status(room: str) -> str:
    """Whether a meeting room (Cedar, Maple, Birch) is free today."""
    found = ROOMS.get(room.strip().title())
    if found is None:
        return f"no room {room!r}; rooms: Cedar, Maple, Birch"
    return f"{room.strip().title()}: {found}"


if __name__ == "__main__":
    server.run()
