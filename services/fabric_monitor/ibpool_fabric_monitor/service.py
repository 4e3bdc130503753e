"""The fabric monitor: topology versions in, port samples -> ibpool_core link health -> link events out."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

import msgspec
from prometheus_client import Counter

from ibpool_core.clock import Clock
from ibpool_core.fabric.index import FabricIndex
from ibpool_core.fabric.link_health import (
    Expected,
    LinkHealth,
    PortRates,
    PortSample,
    Rules,
    link_events,
    observe_with_rates,
    port_rates,
)
from ibpool_core.fabric.model import LANE_GBPS, FabricError, Topology, content_hash, diff
from ibpool_proto.fabric import DiffSummary, TopologyPublished
from ibpool_proto.message import Event
from ibpool_proto.node import HcaPortsReported
from ibpool_runtime.consumer import HandlerContext, Subscription
from ibpool_runtime.logs import get_logger
from ibpool_runtime.service import Kit, repeat_until_stopped, sleep_unless_stopped

from . import state
from .config import FabricMonitorConfig
from .link_metrics import LinkGauges, LinksCollector, link_gauges, link_tiers
from .sources import AgentsSource, CounterSource
from .topology_source import TopologySourceError

log = get_logger(__name__)

TopologyLoader = Callable[[], Topology]
SourceFactory = Callable[[Topology], CounterSource]


class FabricMonitor:
    def __init__(
        self,
        kit: Kit[FabricMonitorConfig],
        load_topology: TopologyLoader,
        make_source: SourceFactory,
        clock: Clock,
    ) -> None:
        self.kit = kit
        self.cfg = kit.config
        self.load_topology = load_topology
        self.make_source = make_source
        self.clock = clock
        self.rules = Rules(
            flap_changes=self.cfg.flap_changes,
            flap_window_s=self.cfg.flap_window_s,
            errors_per_s=self.cfg.errors_per_s,
            congestion_ratio=self.cfg.congestion_ratio,
            clear_after_s=self.cfg.clear_after_s,
        )
        self.version = 0
        self.topology = Topology()
        self.index: FabricIndex | None = None
        self.expected: dict[str, Expected] = {}
        self.source: CounterSource | None = None
        self.healths: dict[str, LinkHealth] = {}
        # For /metrics (link_metrics.py): each link's tier, its rates at the last poll (while up), and
        # the gauges the last poll made of them.
        self.tiers: dict[str, str] = {}
        self.rates: dict[str, PortRates] = {}
        # The samples and healths of the last `judge` and each sample's rates (None: none), which
        # `measure` of the same samples and healths reuses rather than computing them again.
        self._judged: tuple[list[PortSample], Mapping[str, LinkHealth], list[PortRates | None]] = ([], {}, [])
        self.gauges = LinkGauges()
        self.polls = 0
        self.link_writes = Counter(
            "ibpool_fabric_monitor_link_writes",
            "Rows a poll wrote: link verdicts (changed from the last stored, or from clean) and ring samples"
            " (links not up)",
            ["kind"],
            registry=kit.metrics.registry,
        )
        self.state_changes = Counter(
            "ibpool_fabric_link_state_changes",
            "Ports that went down or came up (logical state), by link tier",
            ["tier"],
            registry=kit.metrics.registry,
        )
        kit.metrics.registry.register(LinksCollector(lambda: self.gauges))

    def subscriptions(self) -> list[Subscription]:
        if self.cfg.counter_source != "agents":
            return []
        # Port reports are telemetry: the newest replaces the last, so no inbox transaction.
        return [
            Subscription(
                durable=f"fabric-monitor-{self.kit.store.schema}-hca",
                filter_subjects=(HcaPortsReported.subject_pattern(),),
                handler=self.on_hca_report,
                transactional=False,
            )
        ]

    async def on_hca_report(self, report: HcaPortsReported, ctx: HandlerContext) -> None:
        if isinstance(self.source, AgentsSource):
            self.source.offer(report)

    async def start(self) -> None:
        topology = await asyncio.to_thread(self.load_topology)
        for w in topology.warnings:
            log.warning("topology warning", warning=w)
        await self.publish_topology(topology)
        self.source = self.make_source(topology)
        # The counters stored with a verdict are as old as the verdict: rates start again at the first poll.
        self.healths = {
            k: msgspec.structs.replace(h, last=None) for k, h in (await state.link_healths(self.kit.store.pool)).items()
        }
        self.gauges = link_gauges(self.tiers, self.healths, self.rates)

    async def publish_topology(self, topology: Topology) -> int:
        """Store `topology` as a new version and announce it, unless its content is the current one."""
        digest = content_hash(topology)
        now = self.clock.now()
        async with self.kit.store.transaction() as tx:
            latest = await state.latest_version(tx.conn)
            if latest is not None and latest.content_hash == digest:
                version = latest.version
            else:
                version = 1 if latest is None else latest.version + 1
                summary = None
                if latest is not None:
                    previous = await state.topology(tx.conn, latest.version)
                    if previous is not None:
                        d = diff(previous, topology)
                        summary = DiffSummary(
                            from_version=latest.version,
                            **{name: len(getattr(d, name)) for name in DiffSummary.__struct_fields__[1:]},
                        )
                await state.insert_version(tx.conn, version, digest, topology, now, self.cfg.topology_versions_kept)
                base = self.cfg.public_url or self.kit.http_url or ""
                await tx.outbox(
                    TopologyPublished(
                        source=self.kit.source,
                        key=topology.name,
                        occurred_at=now,
                        version=version,
                        content_hash=digest,
                        hosts=len(topology.hosts),
                        switches=len(topology.switches),
                        links=len(topology.links),
                        url=f"{base}/v1/topology?version={version}" if base else None,
                        diff=summary,
                    )
                )
                log.info("topology published", version=version, hash=digest[:12])
        self.version, self.topology = version, topology
        self.index = await asyncio.to_thread(FabricIndex, topology)
        self.expected = {ln.link_id: Expected(width=ln.width, lane_gbps=LANE_GBPS[ln.speed]) for ln in topology.links}
        self.tiers = link_tiers(topology, self.index.tiers)
        for tier in set(self.tiers.values()):
            self.state_changes.labels(tier)  # every tier's series from the start, at 0
        return version

    async def poll_once(self) -> int:
        """Read every port once, judge each link, publish what changed, and store what is worth it:
        a link's verdict when it changes (its transitions, or which problems are active; not each
        poll's "last seen" of a problem that stays; a link first seen clean, with neither, stores
        nothing: no row is read back as that same clean verdict at a restart), and the
        samples of links that are not up, or that just came back up, in their ring. The counters of a
        healthy link (its last sample) stay in memory: storing every link every poll cost one upsert
        per link per poll twice over, 600,000 rows a poll at 100,000 GPUs."""
        assert self.source is not None
        now = self.clock.now()
        samples = await asyncio.to_thread(self.source.read, now)
        # Judging every link takes seconds of CPU on a large fabric: off the event loop, so the
        # service's API, consumers and outbox relay go on meanwhile.
        updated, events, changed, kept = await asyncio.to_thread(self.judge, samples, self.healths)
        rates, state_changes, gauges = await asyncio.to_thread(self.measure, samples, self.healths, updated)
        async with self.kit.store.transaction() as tx:
            await state.save_health(tx.conn, list(changed.values()), now)
            await state.record_samples(tx.conn, kept, self.cfg.history_per_link, self.cfg.poll_interval_s)
            await tx.outbox(*events)
        self.link_writes.labels("verdict").inc(len(changed))
        self.link_writes.labels("sample").inc(len(kept))
        self.healths.update(updated)
        self.rates, self.gauges = rates, gauges
        for tier, n in state_changes.items():
            self.state_changes.labels(tier).inc(n)
        self.polls += 1
        return len(events)

    def judge(
        self, samples: list[PortSample], healths: dict[str, LinkHealth]
    ) -> tuple[dict[str, LinkHealth], list[Event], dict[str, LinkHealth], list[PortSample]]:
        """One poll's verdicts from the healths before it: every link's new health, the events, the
        verdicts new or changed, and the samples worth keeping (see `poll_once`). Each link's rates
        (`port_rates` against its previous sample) are kept for `measure` of the same samples."""
        updated: dict[str, LinkHealth] = {}
        polled: list[PortRates | None] = []
        events: list[Event] = []
        expected, rules, version, source = self.expected, self.rules, self.version, self.kit.source
        for s in samples:
            link_id = s.link_id
            before = healths.get(link_id) or LinkHealth(link_id=link_id)
            rates = port_rates(before.last, s)
            after, findings = observe_with_rates(before, s, expected.get(link_id), rules, rates)
            updated[link_id] = after
            polled.append(rates)
            # No finding and no problem active before or after: the state stayed "up", no event.
            if findings or before.active or after.active:
                events += link_events(before, after, findings, topology_version=version, source=source)
        self._judged = (samples, healths, polled)
        # A verdict is stored when its transitions or active problems changed, from the clean verdict
        # of a link first seen (what a restart reads for a link with no row).
        changed: dict[str, LinkHealth] = {}
        for k, h in updated.items():
            old = healths.get(k)
            if old is None:
                if h.transitions or h.active:
                    changed[k] = h
            elif old.transitions != h.transitions or old.active.keys() != h.active.keys():
                changed[k] = h
        # Samples of the links not up (a problem active), and of those that just came back (the end
        # of their trouble).
        kept = [s for s in samples if updated[s.link_id].active or (s.link_id in changed and s.link_id in healths)]
        return updated, events, changed, kept

    def measure(
        self, samples: list[PortSample], healths: Mapping[str, LinkHealth], updated: Mapping[str, LinkHealth]
    ) -> tuple[dict[str, PortRates], dict[str, int], LinkGauges]:
        """What /metrics shows after a poll: every link's rates (`port_rates` against its previous
        sample, as `judge` of these samples computed them), the ports that went down or came up per
        tier, and the gauges of the healths after it."""
        judged, judged_healths, polled = self._judged
        reuse = judged is samples and judged_healths is healths and len(polled) == len(samples)
        rates = dict(self.rates)
        changes: dict[str, int] = {}
        for i, s in enumerate(samples):
            link_id = s.link_id
            before = healths.get(link_id)
            prev = before.last if before is not None else None
            r = polled[i] if reuse else port_rates(prev, s)
            if r is None:
                rates.pop(link_id, None)
            else:
                rates[link_id] = r
            if prev is not None and prev.up != s.up:
                tier = self.tiers.get(link_id, "0")
                changes[tier] = changes.get(tier, 0) + 1
        return rates, changes, link_gauges(self.tiers, {**healths, **updated}, rates)

    async def poll_loop(self, stop: asyncio.Event) -> None:
        await repeat_until_stopped(stop, self.cfg.poll_interval_s, self.poll_once, "poll", metrics=self.kit.metrics)

    async def rediscover_loop(self, stop: asyncio.Event) -> None:
        interval = self.cfg.rediscover_interval_s
        if interval <= 0:
            return
        while not stop.is_set():
            await sleep_unless_stopped(stop, interval)
            if stop.is_set():
                return
            try:
                topology = await asyncio.to_thread(self.load_topology)
            except (TopologySourceError, FabricError, OSError) as e:  # a broken file keeps the last good version
                # TopologySourceError: the configured loader's (a file unreadable or not parsing, a
                # discovery command failing); FabricError and OSError: a loader that does not wrap them.
                self.kit.metrics.loop_failed("topology rediscovery", e)
                log.warning("rediscovery failed; keeping the current topology", error=str(e))
                continue
            if content_hash(topology) != content_hash(self.topology):
                await self.publish_topology(topology)
