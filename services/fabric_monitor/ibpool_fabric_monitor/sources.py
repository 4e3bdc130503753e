"""Where port samples come from: the simulated fabric, the sysfs tree of a host's HCAs, or perfquery."""

from __future__ import annotations

import datetime as dt
import shlex
import subprocess
from pathlib import Path
from typing import Protocol

from ibpool_core.fabric.counters import (
    CounterParseError,
    parse_node_guid,
    parse_perfquery,
    parse_rate,
    parse_state,
)
from ibpool_core.fabric.link_health import PortSample
from ibpool_core.fabric.model import PortRef, Topology
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


class SysfsSource:
    """`<root>/sys/class/infiniband/<dev>/ports/<n>/{state,rate,counters/*}` of the local HCAs.

    Each port is matched to its link in the topology by (node GUID, port); ports the topology
    does not know are reported once as a warning and skipped.
    """

    name = "sysfs"

    def __init__(self, root: str | Path, topology: Topology) -> None:
        self.base = Path(root) / "sys" / "class" / "infiniband"
        self.link_of: dict[PortRef, str] = {}
        for link in topology.links:
            self.link_of[link.a] = link.link_id
            self.link_of[link.b] = link.link_id
        self._warned: set[str] = set()

    def read(self, now: dt.datetime) -> list[PortSample]:
        out = []
        for dev in sorted(self.base.glob("*")):
            try:
                guid = parse_node_guid((dev / "node_guid").read_text())
            except (OSError, ValueError) as e:
                self._warn(str(dev), f"cannot read node_guid: {e}")
                continue
            for port_dir in sorted((dev / "ports").glob("*")):
                where = str(port_dir)
                try:
                    ref = PortRef(guid, int(port_dir.name))
                    link_id = self.link_of.get(ref)
                    if link_id is None:
                        self._warn(where, f"port {guid}:{ref.port} is not in the topology")
                        continue
                    _, state = parse_state((port_dir / "state").read_text())
                    width, lane = parse_rate((port_dir / "rate").read_text())
                    counters = {}
                    for f in sorted((port_dir / "counters").glob("*")):
                        text = f.read_text().strip()
                        if text.isdigit():
                            counters[f.name] = int(text)
                except (OSError, ValueError, CounterParseError) as e:
                    self._warn(where, str(e))
                    continue
                out.append(
                    PortSample(
                        link_id=link_id, at=now, up=state == "ACTIVE", width=width, lane_gbps=lane, counters=counters
                    )
                )
        return out

    def _warn(self, where: str, what: str) -> None:
        if where not in self._warned:
            self._warned.add(where)
            log.warning("sysfs port skipped", path=where, reason=what)


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
