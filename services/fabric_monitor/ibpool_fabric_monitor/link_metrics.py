"""What the fabric monitor's /metrics says of the links, with bounded cardinality: counts and worst
rates per tier for every link, and series of their own only for the links that are not healthy
(state other than `up`). Pure: `link_gauges` reads the links' healths and rates and returns data;
`LinksCollector` only reports the last one the poll loop made.

A link's tier is the highest switch tier at its ends (`FabricIndex.tiers`: 1 = leaf), so a host's
cable to its leaf is tier "1", a leaf-spine cable "2", a spine-core cable "3"; "0" when neither end
is a switch of a known tier (a router, a host-to-host cable).

Rates are those `ibpool_core.fabric.link_health.observe` judges by (`port_rates`), between a link's
last two samples while it was up at both: errors per second summed over the error counters, and the
share of time the port waited to send (PortXmitWait ticks), exported capped at 1.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

import msgspec
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from ibpool_core.fabric.link_health import LinkHealth, LinkState, PortRates
from ibpool_core.fabric.model import Topology

LINK_STATES: tuple[LinkState, ...] = ("up", "down", "degraded", "flapping")


def link_tiers(topology: Topology, switch_tiers: Mapping[str, int]) -> dict[str, str]:
    """link id -> its tier label (see the module's docstring), for every link of `topology`."""
    return {
        ln.link_id: str(max(switch_tiers.get(ln.a.guid, 0), switch_tiers.get(ln.b.guid, 0))) for ln in topology.links
    }


class UnhealthyLink(msgspec.Struct, frozen=True, kw_only=True):
    """A link not `up`, as its last sample shows it (None: not known)."""

    link_id: str
    tier: str
    up: bool | None
    width: int | None
    lane_bytes_per_s: float | None
    rates: PortRates | None


class LinkGauges(msgspec.Struct, frozen=True, kw_only=True):
    """`links`: (tier, state) -> links (every state of every tier, 0 included); `error_rate_max` and
    `congestion_max`: tier -> the worst rate over its links (0.0 when none is known); `unhealthy`:
    the links not up, by id."""

    links: dict[tuple[str, str], int] = {}
    error_rate_max: dict[str, float] = {}
    congestion_max: dict[str, float] = {}
    unhealthy: list[UnhealthyLink] = []


def link_gauges(
    tiers: Mapping[str, str], healths: Mapping[str, LinkHealth], rates: Mapping[str, PortRates]
) -> LinkGauges:
    """The gauges of the links of `tiers` (the topology's): their last health and rates. A link not
    judged yet is left out of the counts."""
    known = sorted(set(tiers.values()))
    links: dict[tuple[str, str], int] = {(t, s): 0 for t in known for s in LINK_STATES}
    errors = dict.fromkeys(known, 0.0)
    congestion = dict.fromkeys(known, 0.0)
    unhealthy: list[UnhealthyLink] = []
    up = dict.fromkeys(known, 0)  # the links "up" per tier, counted apart: most links, every poll
    for link_id, tier in tiers.items():
        health = healths.get(link_id)
        if health is None:
            continue
        r = rates.get(link_id)
        if r is not None:
            # max(errors[tier], rate) and max(congestion[tier], min(1.0, ratio)), without the calls.
            if r.errors_per_s > errors[tier]:
                errors[tier] = r.errors_per_s
            ratio = r.congestion_ratio
            if ratio is not None:
                capped = ratio if ratio < 1.0 else 1.0
                if capped > congestion[tier]:
                    congestion[tier] = capped
        if not health.active:  # LinkHealth.state: "up" exactly when no problem is active
            up[tier] += 1
            continue
        state = health.state
        links[(tier, state)] += 1
        if state != "up":
            last = health.last
            unhealthy.append(
                UnhealthyLink(
                    link_id=link_id,
                    tier=tier,
                    up=None if last is None else last.up,
                    width=None if last is None else last.width,
                    lane_bytes_per_s=None if last is None or last.lane_gbps is None else last.lane_gbps * 1e9 / 8,
                    rates=r,
                )
            )
    for tier, n in up.items():
        links[(tier, "up")] += n
    unhealthy.sort(key=lambda u: u.link_id)
    return LinkGauges(links=links, error_rate_max=errors, congestion_max=congestion, unhealthy=unhealthy)


class LinksCollector(Collector):
    """The link gauges of `read()` (the last poll's) at scrape time."""

    def __init__(self, read: Callable[[], LinkGauges]) -> None:
        self.read = read

    def collect(self) -> Iterator[GaugeMetricFamily]:
        g = self.read()
        links = GaugeMetricFamily(
            "ibpool_fabric_links", "Links per tier and state (up, down, degraded, flapping)", labels=["tier", "state"]
        )
        for (tier, state), n in sorted(g.links.items()):
            links.add_metric([tier, state], n)
        errors = GaugeMetricFamily(
            "ibpool_fabric_error_rate_max",
            "The highest error rate of a tier's links (errors per second, between their last two samples)",
            labels=["tier"],
        )
        for tier, rate in sorted(g.error_rate_max.items()):
            errors.add_metric([tier], rate)
        congestion = GaugeMetricFamily(
            "ibpool_fabric_congestion_ratio_max",
            "The highest share of time a port of a tier's links waited to send (0..1, PortXmitWait)",
            labels=["tier"],
        )
        for tier, ratio in sorted(g.congestion_max.items()):
            congestion.add_metric([tier], ratio)
        up = GaugeMetricFamily(
            "ibpool_fabric_link_up",
            "1 when the port is active, 0 when not (links not healthy only)",
            labels=["link", "tier"],
        )
        width = GaugeMetricFamily(
            "ibpool_fabric_link_width_lanes", "Active width in lanes (links not healthy only)", labels=["link", "tier"]
        )
        speed = GaugeMetricFamily(
            "ibpool_fabric_link_speed_bytes_per_second",
            "Active data rate per lane, the InfiniBand speed, in bytes per second (NDR's 100 Gb/s: 1.25e10; the"
            " link carries width x speed; links not healthy only)",
            labels=["link", "tier"],
        )
        error_rate = GaugeMetricFamily(
            "ibpool_fabric_link_error_rate",
            "Errors per second between the last two samples (links not healthy only)",
            labels=["link", "tier"],
        )
        congested = GaugeMetricFamily(
            "ibpool_fabric_link_congestion_ratio",
            "Share of time the port waited to send, 0..1 (links not healthy only)",
            labels=["link", "tier"],
        )
        for u in g.unhealthy:
            labels = [u.link_id, u.tier]
            if u.up is not None:
                up.add_metric(labels, 1.0 if u.up else 0.0)
            if u.width is not None:
                width.add_metric(labels, u.width)
            if u.lane_bytes_per_s is not None:
                speed.add_metric(labels, u.lane_bytes_per_s)
            if u.rates is not None:
                error_rate.add_metric(labels, u.rates.errors_per_s)
                if u.rates.congestion_ratio is not None:
                    congested.add_metric(labels, min(1.0, u.rates.congestion_ratio))
        yield from (links, errors, congestion, up, width, speed, error_rate, congested)
