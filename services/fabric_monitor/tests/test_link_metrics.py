"""The link gauges: rates between two samples, tiers from the switches, bounded series."""

from __future__ import annotations

import datetime as dt

from prometheus_client import CollectorRegistry

from ibpool_core.fabric.link_health import TICKS_PER_SECOND_AT_FULL_WAIT, LinkHealth, PortRates, PortSample, port_rates
from ibpool_core.fabric.model import Ca, Host, Link, PortRef, Switch, build_topology
from ibpool_fabric_monitor.link_metrics import LinksCollector, link_gauges, link_tiers

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
SPINE, LEAF, HCA = "0x00000000000000a1", "0x00000000000000b1", "0x0000000000000101"


def sample(at_s: float, up: bool = True, errors: int = 0, wait: int = 0, width: int = 4) -> PortSample:
    return PortSample(
        link_id="l",
        at=T0 + dt.timedelta(seconds=at_s),
        up=up,
        width=width,
        lane_gbps=100.0,
        counters={"symbol_error": errors, "port_xmit_wait": wait},
    )


def test_rates_are_errors_per_second_and_the_share_of_time_waiting() -> None:
    rates = port_rates(sample(0), sample(2, errors=10, wait=int(TICKS_PER_SECOND_AT_FULL_WAIT)))
    assert rates == PortRates(errors_per_s=5.0, congestion_ratio=0.5)


def test_no_rate_without_a_previous_sample_across_a_down_port_or_without_time() -> None:
    assert port_rates(None, sample(1)) is None
    assert port_rates(sample(0, up=False), sample(1)) is None
    assert port_rates(sample(0), sample(1, up=False)) is None
    assert port_rates(sample(1), sample(1)) is None


def test_waiting_longer_than_the_interval_is_exported_as_a_ratio_of_one() -> None:
    rates = port_rates(sample(0), sample(1, wait=int(3 * TICKS_PER_SECOND_AT_FULL_WAIT)))
    assert rates is not None and rates.congestion_ratio == 3.0  # what the health rule judges by
    g = link_gauges({"x": "1"}, {"x": LinkHealth(link_id="x")}, {"x": rates})
    assert g.congestion_max == {"1": 1.0}


def test_a_link_is_of_the_highest_switch_tier_at_its_ends() -> None:
    topology = build_topology(
        hosts=[Host(name="h0")],
        cas=[Ca(guid=HCA, host="h0")],
        switches=[Switch(guid=SPINE, name="spine", radix=8), Switch(guid=LEAF, name="leaf", radix=8)],
        links=[Link(a=PortRef(LEAF, 1), b=PortRef(SPINE, 1)), Link(a=PortRef(HCA, 1), b=PortRef(LEAF, 2))],
    )
    tiers = link_tiers(topology, {LEAF: 1, SPINE: 2})
    assert sorted(tiers.values()) == ["1", "2"]
    assert link_tiers(topology, {}) == dict.fromkeys(tiers, "0")


def health(link_id: str, last: PortSample | None, *problems: str) -> LinkHealth:
    return LinkHealth(link_id=link_id, last=last, active={p: T0 for p in problems})  # type: ignore[misc]


def test_counts_and_worst_rates_cover_every_link_and_series_of_their_own_only_the_unhealthy() -> None:
    tiers = {"a": "1", "b": "1", "c": "2", "d": "2", "unjudged": "2"}
    healths = {
        "a": health("a", sample(1)),
        "b": health("b", sample(1, up=False), "down"),
        "c": health("c", sample(1, width=1), "degraded_width"),
        "d": health("d", sample(1)),
        "gone": health("gone", sample(1), "down"),  # not in the topology any more
    }
    rates = {
        "a": PortRates(errors_per_s=3.0, congestion_ratio=0.25),
        "c": PortRates(errors_per_s=1.0, congestion_ratio=None),
        "d": PortRates(errors_per_s=0.0, congestion_ratio=0.75),
    }
    g = link_gauges(tiers, healths, rates)
    assert {k: n for k, n in g.links.items() if n} == {
        ("1", "up"): 1,
        ("1", "down"): 1,
        ("2", "degraded"): 1,
        ("2", "up"): 1,
    }
    assert len(g.links) == 8  # every state of every tier
    assert g.error_rate_max == {"1": 3.0, "2": 1.0}
    assert g.congestion_max == {"1": 0.25, "2": 0.75}
    assert [(u.link_id, u.up, u.width, u.lane_bytes_per_s) for u in g.unhealthy] == [
        ("b", False, 4, 12.5e9),
        ("c", True, 1, 12.5e9),
    ]

    registry = CollectorRegistry()
    registry.register(LinksCollector(lambda: g))
    value = registry.get_sample_value
    assert value("ibpool_fabric_links", {"tier": "2", "state": "flapping"}) == 0
    assert value("ibpool_fabric_error_rate_max", {"tier": "1"}) == 3.0
    assert value("ibpool_fabric_congestion_ratio_max", {"tier": "2"}) == 0.75
    assert value("ibpool_fabric_link_up", {"link": "b", "tier": "1"}) == 0
    assert value("ibpool_fabric_link_up", {"link": "a", "tier": "1"}) is None  # healthy: aggregates only
    assert value("ibpool_fabric_link_width_lanes", {"link": "c", "tier": "2"}) == 1
    assert value("ibpool_fabric_link_speed_bytes_per_second", {"link": "c", "tier": "2"}) == 12.5e9
    assert value("ibpool_fabric_link_error_rate", {"link": "c", "tier": "2"}) == 1.0
    assert value("ibpool_fabric_link_error_rate", {"link": "b", "tier": "1"}) is None  # down: no rate
    assert value("ibpool_fabric_link_congestion_ratio", {"link": "c", "tier": "2"}) is None  # not reported
