"""The sysfs counter source on a fake /sys tree (the root is configurable for exactly this)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from ibpool_core.fabric.model import Ca, Host, Link, PortRef, Switch, build_topology
from ibpool_fabric_monitor.sources import SysfsSource
from ibpool_sim.fake_sysfs import write_hca_port

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
CA, LEAF = "0x0002c903000e0b72", "0x0000000000000b01"


def test_reads_state_rate_and_counters_and_maps_ports_to_links(tmp_path: Path) -> None:
    topo = build_topology(
        hosts=[Host(name="gpu001")],
        cas=[Ca(guid=CA, host="gpu001", name="mlx5_0", rail=0)],
        switches=[Switch(guid=LEAF, name="leaf", radix=8)],
        links=[Link(a=PortRef(CA, 1), b=PortRef(LEAF, 3))],
    )
    write_hca_port(
        tmp_path,
        "mlx5_0",
        "0002:c903:000e:0b72",
        1,
        "4: ACTIVE",
        "100 Gb/sec (1X NDR)",
        symbol_error=7,
        port_xmit_wait=12,
    )
    write_hca_port(tmp_path, "mlx5_1", "0002:c903:000e:0b73", 1, "1: DOWN", "10 Gb/sec (4X SDR)")  # not in topology
    write_hca_port(tmp_path, "mlx5_2", "zz:not-a-guid", 1, "4: ACTIVE", "100 Gb/sec (1X NDR)")  # broken
    [s] = SysfsSource(tmp_path, topo).read(NOW)
    assert s.link_id == topo.links[0].link_id and s.up and (s.width, s.lane_gbps) == (1, 100.0)
    assert s.counters == {"symbol_error": 7, "port_xmit_wait": 12}


def test_a_bad_rate_file_skips_that_port_only(tmp_path: Path) -> None:
    topo = build_topology(
        hosts=[Host(name="gpu001")],
        cas=[Ca(guid=CA, host="gpu001", name="mlx5_0", ports=2)],
        switches=[Switch(guid=LEAF, name="leaf", radix=8)],
        links=[Link(a=PortRef(CA, 1), b=PortRef(LEAF, 3)), Link(a=PortRef(CA, 2), b=PortRef(LEAF, 4))],
    )
    write_hca_port(tmp_path, "mlx5_0", "0002:c903:000e:0b72", 1, "4: ACTIVE", "fast")
    write_hca_port(tmp_path, "mlx5_0", "0002:c903:000e:0b72", 2, "4: ACTIVE", "400 Gb/sec (4X NDR)")
    [s] = SysfsSource(tmp_path, topo).read(NOW)
    port2 = next(ln.link_id for ln in topo.links if PortRef(CA, 2) in (ln.a, ln.b))
    assert s.link_id == port2 and s.width == 4


def test_perfquery_source_parses_counters_and_a_failed_query_is_down(tmp_path: Path) -> None:
    from ibpool_fabric_monitor.sources import PerfquerySource

    topo = build_topology(
        hosts=[Host(name="gpu001")],
        cas=[Ca(guid=CA, host="gpu001", name="mlx5_0", ports=2)],
        switches=[Switch(guid=LEAF, name="leaf", radix=8)],
        links=[Link(a=PortRef(CA, 1), b=PortRef(LEAF, 3)), Link(a=PortRef(CA, 2), b=PortRef(LEAF, 4))],
    )
    fake = tmp_path / "perfquery"
    fake.write_text(
        "#!/bin/sh\n"
        '[ "$2" = "2" ] && { echo "ibwarn: query failed" >&2; exit 1; }\n'
        "printf '# Port counters: Lid 3 port %s\\nSymbolErrorCounter:..............42\\n"
        'PortXmitWait:....................7\\n\' "$2"\n'
    )
    fake.chmod(0o755)
    samples = {s.link_id: s for s in PerfquerySource(f"{fake} {{guid}} {{port}}", topo, {"gpu001"}).read(NOW)}
    port1 = next(ln.link_id for ln in topo.links if PortRef(CA, 1) in (ln.a, ln.b))
    port2 = next(ln.link_id for ln in topo.links if PortRef(CA, 2) in (ln.a, ln.b))
    assert samples[port1].up and samples[port1].counters == {"symbol_error": 42, "port_xmit_wait": 7}
    assert samples[port2].up is False


def test_agents_source_gives_each_ports_newest_report_once() -> None:
    from ibpool_fabric_monitor.sources import AgentsSource
    from ibpool_proto.node import HcaPort, HcaPortsReported

    topo = build_topology(
        hosts=[Host(name="gpu001")],
        cas=[Ca(guid=CA, host="gpu001", name="mlx5_0", rail=0)],
        switches=[Switch(guid=LEAF, name="leaf", radix=8)],
        links=[Link(a=PortRef(CA, 1), b=PortRef(LEAF, 3))],
    )

    def report(state: str, *extra: HcaPort) -> HcaPortsReported:
        port = HcaPort(device="mlx5_0", port=1, node_guid=CA, state=state, width=4, lane_gbps=100.0)
        return HcaPortsReported(source="t", key="gpu001", node_id="gpu001", ports=[port, *extra])

    source = AgentsSource(topo)
    stranger = HcaPort(device="mlx5_9", port=1, node_guid="0x00000000000000ff", state="ACTIVE")
    source.offer(report("ACTIVE"))
    source.offer(report("DOWN", stranger))  # the newer report of the same port wins; the stranger is skipped
    [s] = source.read(NOW)
    assert s.link_id == topo.links[0].link_id and s.up is False and s.width == 4
    assert source.read(NOW) == []  # nothing new reported: nothing judged
