"""A poll's pure work (`FabricMonitor.judge` then `measure`): `measure` reuses the rates `judge`
computed for the same samples, and gives what it gives computing them itself."""

from __future__ import annotations

import datetime as dt
import types
from typing import Any

from prometheus_client import CollectorRegistry

from ibpool_core.fabric.generators import rail_optimised
from ibpool_core.fabric.index import FabricIndex
from ibpool_core.fabric.link_health import Expected, PortSample
from ibpool_core.fabric.model import LANE_GBPS
from ibpool_fabric_monitor.bootstrap import source_factory
from ibpool_fabric_monitor.config import FabricMonitorConfig
from ibpool_fabric_monitor.link_metrics import link_tiers
from ibpool_fabric_monitor.service import FabricMonitor
from ibpool_fabric_monitor.sources import SimulatedSource
from ibpool_sim.fabric_faults import Fault

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def monitor() -> FabricMonitor:
    """The monitor of a small generated fabric, its topology adopted as `publish_topology` does, no store."""
    topology = rail_optimised(16, su_size=4)
    cfg = FabricMonitorConfig(counter_source="simulated", clear_after_s=10)
    kit: Any = types.SimpleNamespace(
        config=cfg,
        metrics=types.SimpleNamespace(registry=CollectorRegistry()),
        store=types.SimpleNamespace(schema="test"),
        source="fabric-monitor",
    )
    m = FabricMonitor(kit, lambda: topology, source_factory(cfg), clock=None)  # type: ignore[arg-type]
    m.version, m.topology, m.index = 1, topology, FabricIndex(topology)
    m.expected = {ln.link_id: Expected(width=ln.width, lane_gbps=LANE_GBPS[ln.speed]) for ln in topology.links}
    m.tiers = link_tiers(topology, m.index.tiers)
    m.source = m.make_source(topology)
    return m


def test_measure_reusing_judges_rates_is_measure_computing_them() -> None:
    m = monitor()
    assert isinstance(m.source, SimulatedSource)
    links = list(m.expected)
    kinds = ("down", "flapping", "errors", "width", "speed", "congestion")
    values = (0.0, 5.0, 50.0, 1.0, 50.0, 0.8)
    for i, (kind, value) in enumerate(zip(kinds, values, strict=True)):
        m.source.fabric.inject(Fault(link_id=links[i * 7], kind=kind, value=value), T0)  # type: ignore[arg-type]
    for k in range(12):
        now = T0 + dt.timedelta(seconds=5 * k)
        if k == 6:
            for lid in links[: 6 * 7 : 7]:
                m.source.fabric.clear(lid)
        samples: list[PortSample] = m.source.read(now)
        if k % 3 == 2:  # both ends of a few links reported, as agents do: the same link twice in a poll
            samples += [
                s if s.up else PortSample(link_id=s.link_id, at=now, up=True) for s in samples[:: len(links) // 5]
            ]
            samples += [PortSample(link_id=links[0], at=now, up=False)]
        updated = m.judge(samples, m.healths)[0]
        reused = m.measure(samples, m.healths, updated)
        computed = m.measure(list(samples), m.healths, updated)  # not the samples judged: computed again
        assert list(reused[0].items()) == list(computed[0].items())
        assert reused[1:] == computed[1:]
        m.healths.update(updated)
        m.rates, m.gauges = reused[0], reused[2]
    assert any(h.state != "up" for h in m.healths.values())
