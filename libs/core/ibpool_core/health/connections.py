"""Bus connections as nats-server reports them: which clients, by connection name, have none open.

nats-server publishes an advisory on its system account whenever a client connection opens or
closes (`client_connect`, `client_disconnect`), naming the connection's server, its id on that server
and the name the client gave. Every ibpool process names its connection after the `source` of the
events it publishes (`<service>/<instance>`), so the failover controller can map a closed connection
to the nodes whose agent it was, at once, instead of waiting out the heartbeat window.

`LiveConnections` keeps the open connections per name. `apply(advisory)` returns a
`ConnectionClosed` when the last open connection of a name closed, a `ConnectionOpened` when a name
with none open gets one back, and None otherwise (another connection of the same name remains, or a
repeat). `sync(open, at)` takes the servers' list of open connections (after the controller starts
or reconnects, when advisories may have been missed): names found open are reported opened if they
were closed; a name missing from the list is not reported closed, since its close was not seen (the
heartbeat rule covers it).

Pure: no I/O, no clock. The same advisories in the same order give the same changes.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from typing import Literal

import msgspec


class ConnectionAdvisory(msgspec.Struct, frozen=True, kw_only=True):
    """One connect or disconnect advisory of nats-server, reduced to what liveness needs."""

    # The advisory's own id (unique per advisory).
    id: str
    kind: Literal["connect", "disconnect"]
    # The server the client was connected to, and the client's id on that server.
    server_id: str
    client_id: int
    # The client's connection name ("" when it gave none).
    name: str
    # When the server saw it happen.
    at: dt.datetime


class OpenConnection(msgspec.Struct, frozen=True, kw_only=True):
    server_id: str
    client_id: int
    name: str


class ConnectionClosed(msgspec.Struct, frozen=True, kw_only=True):
    """The last open bus connection named `source` closed at `at` (by the server's clock)."""

    id: str
    source: str
    at: dt.datetime


class ConnectionOpened(msgspec.Struct, frozen=True, kw_only=True):
    """A bus connection named `source`, which had none open, opened at `at`."""

    id: str
    source: str
    at: dt.datetime


ConnectionChange = ConnectionClosed | ConnectionOpened


class LiveConnections:
    """Open connections per name, from advisories and the servers' lists (see the module docstring)."""

    def __init__(self) -> None:
        self.open: dict[str, set[tuple[str, int]]] = {}
        self.closed: set[str] = set()

    def apply(self, advisory: ConnectionAdvisory) -> ConnectionChange | None:
        name = advisory.name
        if not name:
            return None
        conn = (advisory.server_id, advisory.client_id)
        if advisory.kind == "connect":
            self.open.setdefault(name, set()).add(conn)
            if name in self.closed:
                self.closed.discard(name)
                return ConnectionOpened(id=advisory.id, source=name, at=advisory.at)
            return None
        remaining = self.open.get(name, set())
        remaining.discard(conn)
        if remaining:
            return None
        self.open.pop(name, None)
        if name in self.closed:
            return None  # a repeat, or another connection of a name already closed
        self.closed.add(name)
        return ConnectionClosed(id=advisory.id, source=name, at=advisory.at)

    def sync(self, connections: Iterable[OpenConnection], at: dt.datetime) -> list[ConnectionOpened]:
        """Take the servers' list of open connections as the truth; names closed but listed are opened."""
        listed: dict[str, set[tuple[str, int]]] = {}
        for c in connections:
            if c.name:
                listed.setdefault(c.name, set()).add((c.server_id, c.client_id))
        self.open = listed
        back = sorted(self.closed & listed.keys())
        self.closed -= listed.keys()
        return [ConnectionOpened(id=f"sync/{at.isoformat()}/{name}", source=name, at=at) for name in back]
