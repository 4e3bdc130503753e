"""The fabric monitor's link gauges against real NATS and Postgres: links per tier and state, worst
rates per tier, and series of their own only for the links the test breaks (through the simulated
source's fault hooks), gone again once they heal; promtool passes every scrape."""

from __future__ import annotations

import uuid

import aiohttp

from ibpool_runtime.bus import Bus
from ibpool_runtime.store import Store
from tests.integration.helpers import eventually
from tests.integration.metrics_support import Scrape, scrape
from tests.integration.test_fabric_monitor import running_monitor, small_fabric

SPINE = "0x00000000000000a1"
PER_LINK = (
    "ibpool_fabric_link_up",
    "ibpool_fabric_link_width_lanes",
    "ibpool_fabric_link_speed_bytes_per_second",
    "ibpool_fabric_link_error_rate",
    "ibpool_fabric_link_congestion_ratio",
)


def per_link(s: Scrape) -> set[str]:
    return set().union(*(s.labels(name, "link") for name in PER_LINK))


async def test_broken_links_get_series_of_their_own_and_the_tiers_their_worst(bus: Bus, store: Store) -> None:
    fabric = small_fabric(f"fab{uuid.uuid4().hex[:6]}")
    # small_fabric: two leaf-spine cables (tier 2) and four host-leaf cables (tier 1).
    uplinks = [ln.link_id for ln in fabric.links if SPINE in ln.link_id]
    host_links = [ln.link_id for ln in fabric.links if SPINE not in ln.link_id]
    assert (len(uplinks), len(host_links)) == (2, 4)
    down, errors, narrow, slow = host_links
    flapping, congested = uplinks
    faults: dict[str, dict[str, object]] = {
        down: {"kind": "down"},
        errors: {"kind": "errors", "value": 1000},
        narrow: {"kind": "width", "value": 1},
        slow: {"kind": "speed", "value": 50.0},
        flapping: {"kind": "flapping", "value": 0.25},
        congested: {"kind": "congestion", "value": 0.9},
    }
    async with running_monitor(bus, store, [fabric]) as svc, aiohttp.ClientSession() as http:
        url = svc.http_url
        assert url is not None

        async def all_up() -> bool:
            s = await scrape(url)
            return (
                s.value("ibpool_fabric_links", tier="1", state="up"),
                s.value("ibpool_fabric_links", tier="2", state="up"),
            ) == (4.0, 2.0)

        await eventually(all_up, what="every link judged up")
        s = await scrape(url)
        assert per_link(s) == set()  # healthy links: aggregates only
        assert s.value("ibpool_fabric_link_state_changes_total", tier="1") == 0.0
        assert s.value("ibpool_fabric_link_state_changes_total", tier="2") == 0.0
        assert s.value("ibpool_service_leader", service="fabric_monitor") == 1.0

        for link_id, body in faults.items():
            async with http.post(f"{url}/v1/sim/faults", json={"link_id": link_id, **body}) as r:
                assert r.status == 202, await r.text()

        async def every_fault_seen() -> bool:
            s = await scrape(url)
            return (
                per_link(s) == set(faults)
                and s.value("ibpool_fabric_link_state_changes_total", tier="2") is not None
                and s.value("ibpool_fabric_link_state_changes_total", tier="2") >= 3  # type: ignore[operator]
                and s.value("ibpool_fabric_link_error_rate", link=errors, tier="1") is not None
                and s.value("ibpool_fabric_link_congestion_ratio", link=congested, tier="2") is not None
            )

        await eventually(every_fault_seen, timeout_s=20, what="a series of its own for every broken link")
        s = await scrape(url)
        assert s.value("ibpool_fabric_links", tier="1", state="down") == 1.0
        assert s.value("ibpool_fabric_links", tier="1", state="degraded") == 3.0
        assert s.value("ibpool_fabric_links", tier="1", state="up") == 0.0
        assert s.value("ibpool_fabric_links", tier="2", state="flapping") == 1.0
        assert s.value("ibpool_fabric_links", tier="2", state="degraded") == 1.0
        assert s.value("ibpool_fabric_link_up", link=down, tier="1") == 0.0
        assert s.value("ibpool_fabric_link_up", link=narrow, tier="1") == 1.0
        assert s.value("ibpool_fabric_link_width_lanes", link=narrow, tier="1") == 1.0
        assert s.value("ibpool_fabric_link_speed_bytes_per_second", link=slow, tier="1") == 50e9 / 8  # HDR
        assert s.value("ibpool_fabric_link_speed_bytes_per_second", link=narrow, tier="1") == 100e9 / 8  # NDR
        error_rate = s.value("ibpool_fabric_link_error_rate", link=errors, tier="1")
        assert error_rate is not None and error_rate > 100  # 1000/s injected; the threshold is 5
        assert s.value("ibpool_fabric_error_rate_max", tier="1") == error_rate
        ratio = s.value("ibpool_fabric_link_congestion_ratio", link=congested, tier="2")
        assert ratio is not None and 0.5 < ratio <= 1.0  # 0.9 injected
        assert s.value("ibpool_fabric_congestion_ratio_max", tier="2") == ratio
        assert s.value("ibpool_fabric_link_state_changes_total", tier="1") == 1.0  # `down` went down once

        for link_id in faults:
            async with http.delete(f"{url}/v1/sim/faults/{link_id}") as r:
                assert r.status == 200

        async def healed() -> bool:
            s = await scrape(url)
            return per_link(s) == set() and s.value("ibpool_fabric_links", tier="1", state="up") == 4.0

        await eventually(healed, timeout_s=20, what="every link up again, its series gone")
        s = await scrape(url)
        assert s.value("ibpool_fabric_links", tier="2", state="up") == 2.0
        assert s.value("ibpool_fabric_link_state_changes_total", tier="1") == 2.0  # and came back up
