"""What placement reads besides the ledger and the fabric: node telemetry and which adapter is whose.

Telemetry is state, not history: the newest sample replaces the last, so every replica follows it
from the last message of every subject on (`ibpool_runtime.follow.follow_latest`: no acks, nothing
stored; a restart reads the newest again).

- `TelemetryReported` -> per node the placement view's `Telemetry`: mean GPU utilisation, the
  hottest GPU, mean memory in use (of each GPU's memory as the ledger knows it).
- `HcaPortsReported` -> which adapter GUID belongs to which node. While no fabric was ever
  published, a node's link state is the worst state of the links (`FabricFeed.links`) that end at
  one of its adapters (`node_links`); once the fabric is known, it says where every link falls
  (`ibpool_runtime.fabric_feed.FabricFeed.link_health`), leaf uplinks included.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import heapq
from collections.abc import Mapping

from ibpool_core.fabric.link_health import LinkState
from ibpool_core.pool.ledger import Node
from ibpool_core.sched.book import ChangedMap
from ibpool_core.sched.framework import Telemetry
from ibpool_proto.node import HcaPortsReported, TelemetryReported
from ibpool_runtime.bus import Bus
from ibpool_runtime.follow import follow_latest
from ibpool_runtime.metrics import ServiceMetrics

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


class PlacementTelemetry:
    """node id -> the placement view (`telemetry_of`) of its newest sample not older than `max_age_s`,
    as a `ChangedMap` a cycle reads in the work of what changed: `update(feed, nodes, now)` takes the
    samples that came since the last call (`NodeFeed.take_fresh`) and drops those that aged out
    (a heap of sample times, one entry per node), not a walk over every node's sample."""

    def __init__(self, max_age_s: float) -> None:
        self.max_age = dt.timedelta(seconds=max_age_s)
        self.view: ChangedMap[Telemetry] = ChangedMap()
        self._due: list[tuple[dt.datetime, str]] = []  # (sampled at, node id), a heap
        self._queued: set[str] = set()  # the nodes in `_due`

    def update(self, feed: NodeFeed, nodes: Mapping[str, Node], now: dt.datetime) -> ChangedMap[Telemetry]:
        view, due, queued = self.view, self._due, self._queued
        samples = feed.samples
        oldest = now - self.max_age  # a sample older than this is too old
        for node_id in feed.take_fresh():
            at, sample = samples[node_id]
            if at < oldest:
                view.drop(node_id)
                continue
            node = nodes.get(node_id)
            memory = {g.index: g.memory_mib for g in node.gpus} if node is not None else {}
            view.put(node_id, telemetry_of(sample, memory))
            if node_id not in queued:
                queued.add(node_id)
                heapq.heappush(due, (at, node_id))
        while due and due[0][0] < oldest:
            at, node_id = heapq.heappop(due)
            hit = samples.get(node_id)
            if hit is not None and hit[0] > at:  # a newer sample came since: it ages in turn
                heapq.heappush(due, (hit[0], node_id))
                continue
            queued.discard(node_id)
            view.drop(node_id)
        return view


class NodeFeed:
    def __init__(self, bus: Bus, metrics: ServiceMetrics | None = None) -> None:
        self.bus = bus
        self.metrics = metrics  # where a failed follow is counted (`ibpool_loop_failures`)
        # node id -> (when sampled, the sample)
        self.samples: dict[str, tuple[dt.datetime, TelemetryReported]] = {}
        # The nodes with a newer sample since the last `take_fresh()`.
        self._fresh: dict[str, None] = {}
        self.guid_node: dict[str, str] = {}
        # Bumped on every change of `guid_node`, so a caller rebuilds `node_links` only when it moved.
        self.adapters_version = 0

    # -- folding ---------------------------------------------------------------------------------

    def on_message(self, message: object) -> None:
        match message:
            case TelemetryReported():
                old = self.samples.get(message.node_id)
                if old is None or message.occurred_at >= old[0]:
                    self.samples[message.node_id] = (message.occurred_at, message)
                    self._fresh[message.node_id] = None
            case HcaPortsReported():
                for port in message.ports:
                    if self.guid_node.get(port.node_guid) != message.node_id:
                        self.guid_node[port.node_guid] = message.node_id
                        self.adapters_version += 1

    def take_fresh(self) -> list[str]:
        """The nodes with a newer sample since the last call."""
        fresh, self._fresh = self._fresh, {}
        return list(fresh)

    def telemetry(self, node_id: str, now: dt.datetime, max_age_s: float) -> TelemetryReported | None:
        """The node's newest sample if it is at most `max_age_s` old."""
        hit = self.samples.get(node_id)
        if hit is None or (now - hit[0]).total_seconds() > max_age_s:
            return None
        return hit[1]

    def node_links(self, links: Mapping[str, tuple[dt.datetime, LinkState]]) -> dict[str, LinkState]:
        """node id -> the worst state of the links (link id -> (when, state)) at its adapters, for
        nodes with one not "up": the fallback while no fabric was published."""
        out: dict[str, LinkState] = {}
        for link_id, (_, state) in links.items():
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
        await asyncio.gather(
            *(follow_latest(self.bus, p, stop, self.on_message, metrics=self.metrics) for p in patterns)
        )
