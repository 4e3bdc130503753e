"""Where port samples come from: the simulated fabric, HCAs in sysfs (read here or by node agents), or perfquery."""

from __future__ import annotations

import datetime as dt
import shlex
import subprocess
from pathlib import Path
from typing import Protocol

from ibpool_core.fabric.counters import CounterParseError, parse_perfquery
from ibpool_core.fabric.link_health import PortSample
from ibpool_core.fabric.model import PortRef, Topology
from ibpool_proto.node import HcaPort, HcaPortsReported
from ibpool_runtime.hca_sysfs import read_hca_ports
from ibpool_runtime.logs import get_logger
from ibpool_sim.fabric_faults import SimulatedFabric

log = get_logger(__name__)


class CounterSource(Protocol):
    name: str

    def read(self, now: dt.datetime) -> list[PortSample]:
        """One sample per port this source can see, at `now`."""
        ...


class SimulatedSource:
    name = "simulated"

    def __init__(self, topology: Topology, seed: int) -> None:
        self.fabric = SimulatedFabric(topology, seed=seed)

    def read(self, now: dt.datetime) -> list[PortSample]:
        return self.fabric.read(now)


class _PortMap:
    """(node GUID, port) -> link id from the topology; ports it does not know are warned about once."""

    def __init__(self, topology: Topology, what: str) -> None:
        self.link_of: dict[PortRef, str] = {}
        for link in topology.links:
            self.link_of[link.a] = link.link_id
            self.link_of[link.b] = link.link_id
        self.what = what
        self._warned: set[str] = set()

    def samples(self, ports: list[HcaPort], now: dt.datetime, where: str) -> list[PortSample]:
        out = []
        for p in ports:
            link_id = self.link_of.get(PortRef(p.node_guid, p.port))
            if link_id is None:
                self.warn(f"{where} {p.device}/{p.port}", f"port {p.node_guid}:{p.port} is not in the topology")
                continue
            out.append(
                PortSample(
                    link_id=link_id,
                    at=now,
                    up=p.state == "ACTIVE",
                    width=p.width,
                    lane_gbps=p.lane_gbps,
                    counters=p.counters,
                )
            )
        return out

    def warn(self, where: str, what: str) -> None:
        if where not in self._warned:
            self._warned.add(where)
            log.warning(f"{self.what} port skipped", path=where, reason=what)


class SysfsSource:
    """`<root>/sys/class/infiniband/<dev>/ports/<n>/{state,rate,counters/*}` of the local HCAs.

    Each port is matched to its link in the topology by (node GUID, port); ports the topology
    does not know are reported once as a warning and skipped.
    """

    name = "sysfs"

    def __init__(self, root: str | Path, topology: Topology) -> None:
        self.root = root
        self.ports = _PortMap(topology, "sysfs")

    def read(self, now: dt.datetime) -> list[PortSample]:
        ports, problems = read_hca_ports(self.root)
        for where, what in problems:
            self.ports.warn(where, what)
        return self.ports.samples(ports, now, "sysfs")


class AgentsSource:
    """The ports node agents read from their own hosts' sysfs and report (`HcaPortsReported`).

    For clusters without a fabric manager the monitor sees: each poll returns what the agents
    reported since the previous poll, the newest report per port; a port no agent reported
    stays unjudged (the rules act on samples, so silence is not taken for a link going down).
    """

    name = "agents"

    def __init__(self, topology: Topology) -> None:
        self.ports = _PortMap(topology, "agent-reported")
        self.pending: dict[tuple[str, str, int], tuple[str, HcaPort]] = {}

    def offer(self, report: HcaPortsReported) -> None:
        for p in report.ports:
            self.pending[(report.node_id, p.device, p.port)] = (report.node_id, p)

    def read(self, now: dt.datetime) -> list[PortSample]:
        taken, self.pending = self.pending, {}
        out = []
        for node_id, port in taken.values():
            out += self.ports.samples([port], now, f"node {node_id}")
        return out


class PerfquerySource:
    """Runs `perfquery` (infiniband-diags) for one end of every link and parses its counters.

    `command` is a template with `{guid}` and `{port}`, e.g. `perfquery -G {guid} {port}`. A
    query that fails counts as the port being down. `hosts` limits it to the links of those
    hosts' adapters (one host watching its own HCAs); empty means every link, for small fabrics.
    """

    name = "perfquery"

    def __init__(self, command: str, topology: Topology, hosts: set[str] | None = None, timeout_s: float = 5.0):
        cas = {c.guid: c.host for c in topology.cas}
        self.command = command
        self.timeout_s = timeout_s
        self.targets: list[tuple[str, PortRef]] = []
        for link in topology.links:
            ends = [e for e in (link.a, link.b) if e.guid in cas and (not hosts or cas[e.guid] in hosts)]
            if hosts and not ends:
                continue
            self.targets.append((link.link_id, ends[0] if ends else link.a))
        self._warned: set[str] = set()

    def read(self, now: dt.datetime) -> list[PortSample]:
        out = []
        for link_id, end in self.targets:
            argv = shlex.split(self.command.format(guid=end.guid, port=end.port))
            try:
                r = subprocess.run(argv, capture_output=True, text=True, timeout=self.timeout_s, check=False)
            except (OSError, subprocess.TimeoutExpired) as e:
                self._warn(link_id, f"{argv[0]}: {e}")
                continue
            if r.returncode != 0:
                out.append(PortSample(link_id=link_id, at=now, up=False))
                continue
            try:
                counters = parse_perfquery(r.stdout)
            except CounterParseError as e:
                self._warn(link_id, str(e))
                continue
            out.append(PortSample(link_id=link_id, at=now, up=True, counters=counters, counter_bits=32))
        return out

    def _warn(self, where: str, what: str) -> None:
        if where not in self._warned:
            self._warned.add(where)
            log.warning("perfquery read skipped", link_id=where, reason=what)


class NoSource:
    name = "none"

    def read(self, now: dt.datetime) -> list[PortSample]:
        return []
