"""Client connections as nats-server sees them, from its system account.

Every nats-server publishes `$SYS.ACCOUNT.<account>.CONNECT` and `.DISCONNECT` advisories when a
client connection opens or closes, with the connection's server, id and name; its `CONNZ` request
lists the connections open now. `follow_connections` connects as a system-account user, subscribes
to both advisories, asks every server for its open connections (at start and after each reconnect,
when advisories may have been missed) and hands what it read, decoded into
`ibpool_core.health.connections`'s terms, to its callbacks. An advisory that does not decode is
logged and counted, never handed on.

Every ibpool process names its connection after its events' `source` (`connection_name`), which is
how a closed connection is mapped back to the nodes of the agent that held it.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import socket
from collections.abc import Callable

import msgspec
from nats.aio.msg import Msg

from ibpool_core.health.connections import ConnectionAdvisory, OpenConnection

from .bus import Bus
from .logs import get_logger
from .metrics import ServiceMetrics, count_failure
from .outages import OUTAGES

log = get_logger(__name__)

ADVISORIES = ("$SYS.ACCOUNT.*.CONNECT", "$SYS.ACCOUNT.*.DISCONNECT")
CONNZ = "$SYS.REQ.SERVER.PING.CONNZ"
# Connections asked for per page, and how long to wait for the servers' answers to one page.
PAGE = 1024
ANSWERS_S = 1.0


def connection_name(service: str, instance: str) -> str:
    """The bus connection name of a process, which is also the `source` of the events it publishes."""
    return f"{service}/{instance or socket.gethostname()}"


class _Server(msgspec.Struct, frozen=True):
    id: str


class _Client(msgspec.Struct, frozen=True):
    id: int
    name: str = ""


class _Advisory(msgspec.Struct, frozen=True):
    type: str
    id: str
    timestamp: dt.datetime
    server: _Server
    client: _Client


KINDS = {
    "io.nats.server.advisory.v1.client_connect": "connect",
    "io.nats.server.advisory.v1.client_disconnect": "disconnect",
}


class _Conn(msgspec.Struct, frozen=True):
    cid: int
    name: str = ""


class _ConnzData(msgspec.Struct, frozen=True):
    server_id: str
    total: int = 0
    connections: list[_Conn] = []


class _Connz(msgspec.Struct, frozen=True):
    data: _ConnzData


def decode_advisory(data: bytes) -> ConnectionAdvisory:
    """One connect/disconnect advisory; ValueError saying what is wrong with it."""
    try:
        a = msgspec.json.decode(data, type=_Advisory)
    except msgspec.DecodeError as e:
        raise ValueError(f"not a connection advisory: {e}") from None
    kind = KINDS.get(a.type)
    if kind is None:
        raise ValueError(f"advisory type {a.type!r} is not a client connect or disconnect")
    return ConnectionAdvisory(
        id=a.id,
        kind=kind,  # type: ignore[arg-type]
        server_id=a.server.id,
        client_id=a.client.id,
        name=a.client.name,
        at=a.timestamp,
    )


async def open_connections(bus: Bus, answers_s: float = ANSWERS_S) -> list[OpenConnection]:
    """Every connection open on every server that answers within `answers_s` (page by page)."""
    found: list[OpenConnection] = []
    offset = 0
    while True:
        replies: list[_Connz] = []
        inbox = bus.nc.new_inbox()
        sub = await bus.nc.subscribe(inbox)
        try:
            await bus.nc.publish(CONNZ, json.dumps({"offset": offset, "limit": PAGE}).encode(), reply=inbox)
            loop = asyncio.get_running_loop()
            until = loop.time() + answers_s
            while (left := until - loop.time()) > 0:
                try:
                    msg = await sub.next_msg(timeout=left)
                except TimeoutError:
                    break
                try:
                    replies.append(msgspec.json.decode(msg.data, type=_Connz))
                except msgspec.DecodeError as e:
                    log.warning("a server's connection list does not decode", error=str(e))
        finally:
            await sub.unsubscribe()
        for r in replies:
            found += [
                OpenConnection(server_id=r.data.server_id, client_id=c.cid, name=c.name) for c in r.data.connections
            ]
        if not any(r.data.total > offset + PAGE for r in replies):
            return found
        offset += PAGE


async def follow_connections(
    url: str,
    *,
    name: str,
    stop: asyncio.Event,
    on_advisory: Callable[[ConnectionAdvisory], None],
    on_open: Callable[[list[OpenConnection]], None],
    tls_ca: str = "",
    metrics: ServiceMetrics | None = None,
) -> None:
    """Hand every connect/disconnect advisory to `on_advisory` and the servers' lists of open
    connections to `on_open` (after subscribing, and after every reconnect), until `stop`."""
    bus = await Bus.connect(url, name=name, tls_ca=tls_ca, metrics=metrics)
    try:

        async def on_message(msg: Msg) -> None:
            try:
                advisory = decode_advisory(msg.data)
            except ValueError as e:
                count_failure(metrics, "connection advisories", e)
                log.warning("connection advisory dropped", subject=msg.subject, error=str(e))
                return
            on_advisory(advisory)

        async def sync() -> None:
            on_open(await open_connections(bus))

        for subject in ADVISORIES:
            await bus.nc.subscribe(subject, cb=on_message)
        await bus.nc.flush()
        try:
            await sync()
        except OUTAGES as e:
            count_failure(metrics, "connection list", e)
            log.warning("could not list the open connections", error=str(e) or type(e).__name__)
        bus.on_reconnect(sync)
        log.info("following client connections", subjects=list(ADVISORIES))
        await stop.wait()
    finally:
        await bus.close()
