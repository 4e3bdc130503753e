"""A simulated fabric that produces port samples for every link, with faults injected on demand.

Deterministic: the caller gives the time; traffic noise comes from a seeded generator. Faults:
`down`, `flapping` (toggles every `period_s`), `errors` (symbol errors per second), `width`
(e.g. 4x -> 1x), `speed` (e.g. NDR -> HDR per lane), `congestion` (fraction of time waiting).
"""

from __future__ import annotations

import datetime as dt
import random
from typing import Literal

import msgspec

from ibpool_core.fabric.link_health import CONGESTION_COUNTER, TICKS_PER_SECOND_AT_FULL_WAIT, PortSample
from ibpool_core.fabric.model import LANE_GBPS, Topology

FaultKind = Literal["down", "flapping", "errors", "width", "speed", "congestion"]


class Fault(msgspec.Struct, frozen=True, kw_only=True):
    link_id: str
    kind: FaultKind
    # errors: per second; width: lanes; speed: Gb/s per lane; congestion: 0..1; flapping: period in s
    value: float = 0.0


class UnknownLink(KeyError):
    pass


class SimulatedFabric:
    def __init__(self, topology: Topology, seed: int = 0) -> None:
        self.links = {ln.link_id: ln for ln in topology.links}
        self.faults: dict[str, Fault] = {}
        self._rng = random.Random(seed)
        self._counters: dict[str, dict[str, int]] = {
            lid: {"symbol_error": 0, "link_error_recovery": 0, "port_rcv_errors": 0, CONGESTION_COUNTER: 0}
            for lid in self.links
        }
        self._last: dt.datetime | None = None
        self._since: dict[str, dt.datetime] = {}

    def inject(self, fault: Fault, now: dt.datetime) -> None:
        if fault.link_id not in self.links:
            raise UnknownLink(f"no link {fault.link_id!r} in the simulated fabric")
        if fault.kind == "speed" and fault.value not in LANE_GBPS.values():
            raise ValueError(f"speed fault needs a lane rate in Gb/s, one of {sorted(set(LANE_GBPS.values()))}")
        self.faults[fault.link_id] = fault
        self._since[fault.link_id] = now

    def clear(self, link_id: str) -> None:
        if link_id not in self.links:
            raise UnknownLink(f"no link {link_id!r} in the simulated fabric")
        self.faults.pop(link_id, None)
        self._since.pop(link_id, None)

    def read(self, now: dt.datetime) -> list[PortSample]:
        """One sample per link at `now`; counters advance by the time since the previous read."""
        seconds = 0.0 if self._last is None else max(0.0, (now - self._last).total_seconds())
        self._last = now
        out = []
        for lid, link in self.links.items():
            fault = self.faults.get(lid)
            counters = self._counters[lid]
            up, width, lane = True, link.width, LANE_GBPS[link.speed]
            if fault is not None:
                match fault.kind:
                    case "down":
                        up = False
                    case "flapping":
                        period = fault.value or 5.0
                        elapsed = (now - self._since[lid]).total_seconds()
                        up = int(elapsed // period) % 2 == 1
                    case "errors":
                        counters["symbol_error"] += int(fault.value * seconds)
                    case "width":
                        width = int(fault.value) or 1
                    case "speed":
                        lane = fault.value
                    case "congestion":
                        counters[CONGESTION_COUNTER] += int(fault.value * seconds * TICKS_PER_SECOND_AT_FULL_WAIT)
            # Healthy links see the odd symbol error now and then, far below any threshold.
            if up and self._rng.random() < 0.001:
                counters["symbol_error"] += 1
            out.append(PortSample(link_id=lid, at=now, up=up, width=width, lane_gbps=lane, counters=dict(counters)))
        return out
