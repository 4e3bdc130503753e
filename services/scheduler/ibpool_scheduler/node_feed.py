"""What placement reads besides the ledger: node telemetry and link health, followed in memory.

Telemetry and link verdicts are state, not history: the newest of each replaces the last, so every
replica follows them with ephemeral consumers from the last message of every subject on (no acks,
nothing stored; a restart reads the newest again).

- `TelemetryReported` -> per node the placement view's `Telemetry`: mean GPU utilisation, the
  hottest GPU, mean memory in use (of each GPU's memory as the ledger knows it).
- `HcaPortsReported` -> which adapter GUID belongs to which node; `LinkStateChanged`,
  `LinkDegraded`, `LinkFlapping`, `LinkRecovered` -> the newest state of each link; a node's link
  state is the worst state of the links that end at one of its adapters. (Links above a leaf
  switch need the fabric's topology to be tied to nodes; they are not counted here.)
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
from collections.abc import Callable

import nats.errors
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from ibpool_core.fabric.link_health import LinkState
from ibpool_core.sched.framework import Telemetry
from ibpool_proto import DecodeError, decode
from ibpool_proto.fabric import LinkDegraded, LinkFlapping, LinkRecovered, LinkStateChanged
from ibpool_proto.node import HcaPortsReported, TelemetryReported
from ibpool_runtime.bus import Bus
from ibpool_runtime.logs import get_logger
from ibpool_runtime.service import sleep_unless_stopped
from ibpool_runtime.streams import stream_for_subject

log = get_logger(__name__)

BATCH = 512
INACTIVE_S = 10.0
LINK_NEWS = (LinkStateChanged, LinkDegraded, LinkFlapping, LinkRecovered)
_RANK: dict[str, int] = {"up": 0, "degraded": 1, "flapping": 2, "down": 3}


def telemetry_of(sample: TelemetryReported, memory_mib: dict[int, int]) -> Telemetry:
    """The placement view of one sample; `memory_mib`: GPU index -> its memory (absent: unknown,
    that GPU's memory use counts as none)."""
    gpus = sample.gpus
    if not gpus:
        return Telemetry()
    used = [g.memory_used_mib / memory_mib[g.index] for g in gpus if memory_mib.get(g.index)]
    return Telemetry(
        gpu_util=min(1.0, max(0.0, sum(g.utilization_pct for g in gpus) / len(gpus) / 100.0)),
        temperature_c=max(g.temperature_c for g in gpus),
        memory_used=min(1.0, sum(used) / len(gpus)) if used else 0.0,
    )


def link_guids(link_id: str) -> tuple[str, ...]:
    """The GUIDs at both ends of a link id (`guid:port-guid:port`); () when it is not one."""
    ends = link_id.split("-")
    if len(ends) != 2:
        return ()
    return tuple(end.rsplit(":", 1)[0] for end in ends)


class NodeFeed:
    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        # node id -> (when sampled, the sample)
        self.samples: dict[str, tuple[dt.datetime, TelemetryReported]] = {}
        self.guid_node: dict[str, str] = {}
        # link id -> (when, state)
        self.links: dict[str, tuple[dt.datetime, LinkState]] = {}
        # Bumped on every change of `node_links`' inputs, so a caller rebuilds only when it moved.
        self.links_version = 0

    # -- folding ---------------------------------------------------------------------------------

    def on_message(self, message: object) -> None:
        match message:
            case TelemetryReported():
                old = self.samples.get(message.node_id)
                if old is None or message.occurred_at >= old[0]:
                    self.samples[message.node_id] = (message.occurred_at, message)
            case HcaPortsReported():
                for port in message.ports:
                    if self.guid_node.get(port.node_guid) != message.node_id:
                        self.guid_node[port.node_guid] = message.node_id
                        self.links_version += 1
            case LinkStateChanged() | LinkDegraded() | LinkFlapping() | LinkRecovered():
                state: LinkState
                if isinstance(message, LinkStateChanged):
                    state = message.state
                elif isinstance(message, LinkDegraded):
                    state = "degraded"
                elif isinstance(message, LinkFlapping):
                    state = "flapping"
                else:
                    state = "up"
                old_link = self.links.get(message.link_id)
                if old_link is None or message.occurred_at >= old_link[0]:
                    self.links[message.link_id] = (message.occurred_at, state)
                    self.links_version += 1

    def telemetry(self, node_id: str, now: dt.datetime, max_age_s: float) -> TelemetryReported | None:
        """The node's newest sample if it is at most `max_age_s` old."""
        hit = self.samples.get(node_id)
        if hit is None or (now - hit[0]).total_seconds() > max_age_s:
            return None
        return hit[1]

    def node_links(self) -> dict[str, LinkState]:
        """node id -> the worst state of the links at its adapters, for nodes with one not "up"."""
        out: dict[str, LinkState] = {}
        for link_id, (_, state) in self.links.items():
            if state == "up":
                continue
            for guid in link_guids(link_id):
                node = self.guid_node.get(guid)
                if node is not None and _RANK[state] > _RANK[out.get(node, "up")]:
                    out[node] = state
        return out

    # -- following -------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        patterns = [TelemetryReported.subject_pattern(), HcaPortsReported.subject_pattern()]
        patterns += [t.subject_pattern() for t in LINK_NEWS]
        await asyncio.gather(*(self._follow(p, stop, self.on_message) for p in patterns))

    async def _follow(self, pattern: str, stop: asyncio.Event, handle: Callable[[object], None]) -> None:
        sub = None
        while not stop.is_set():
            try:
                if sub is None:
                    sub = await self.bus.js.pull_subscribe(
                        pattern,
                        stream=stream_for_subject(pattern),
                        config=ConsumerConfig(
                            deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
                            ack_policy=AckPolicy.NONE,
                            inactive_threshold=INACTIVE_S,
                        ),
                    )
                msgs = await sub.fetch(BATCH, timeout=0.5)
            except (nats.errors.TimeoutError, TimeoutError):
                continue
            except (nats.errors.ConnectionClosedError, nats.errors.ConnectionDrainingError):
                break
            except Exception as e:  # the server dropped the consumer (reconnect, inactivity): start anew
                log.warning("following node news failed; resubscribing", subject=pattern, error=str(e) or repr(e))
                sub = None
                await sleep_unless_stopped(stop, 0.5)
                continue
            for m in msgs:
                try:
                    handle(decode(m.data))
                except DecodeError as e:
                    log.warning("undecodable node news dropped", subject=m.subject, error=str(e))
        if sub is not None:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
