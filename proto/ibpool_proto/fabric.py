"""Fabric domain: the InfiniBand topology and the state of its links."""

from __future__ import annotations

from typing import ClassVar, Literal

import msgspec

from .message import Event

LinkState = Literal["up", "down", "degraded", "flapping"]
LinkProblem = Literal["down", "flapping", "errors", "degraded_width", "degraded_speed", "congested"]


class DiffSummary(msgspec.Struct, frozen=True, kw_only=True):
    """How a topology version differs from the one before it (counts; the full diff is on HTTP)."""

    from_version: int
    hosts_added: int = 0
    hosts_removed: int = 0
    hosts_changed: int = 0
    switches_added: int = 0
    switches_removed: int = 0
    switches_changed: int = 0
    links_added: int = 0
    links_removed: int = 0
    links_changed: int = 0


class TopologyPublished(Event, frozen=True, kw_only=True, tag="io.ibpool.fabric.topology.published.v1"):
    key_name: ClassVar[str] = "fabric"
    summary: ClassVar[str] = "A new immutable topology version exists."

    version: int
    content_hash: str
    hosts: int
    switches: int
    links: int
    # Where to fetch the full topology (the fabric monitor's GET /topology?version=N).
    url: str | None = None
    diff: DiffSummary | None = None


class LinkStateChanged(Event, frozen=True, kw_only=True, tag="io.ibpool.fabric.link.changed.v1"):
    key_name: ClassVar[str] = "link_id"
    summary: ClassVar[str] = "A fabric link changed state (up, down, degraded, flapping)."

    link_id: str
    state: LinkState
    previous_state: LinkState
    topology_version: int
    reason: str = ""
    evidence: dict[str, float] = {}


class LinkDegraded(Event, frozen=True, kw_only=True, tag="io.ibpool.fabric.link.degraded.v1"):
    key_name: ClassVar[str] = "link_id"
    summary: ClassVar[str] = "A link's error counters or rate crossed the degradation threshold."

    link_id: str
    topology_version: int
    symbol_errors_per_min: float = 0.0
    active_rate_gbps: float | None = None
    expected_rate_gbps: float | None = None
    reason: str = ""
    problem: LinkProblem | None = None
    evidence: dict[str, float] = {}


class LinkFlapping(Event, frozen=True, kw_only=True, tag="io.ibpool.fabric.link.flapping.v1"):
    key_name: ClassVar[str] = "link_id"
    summary: ClassVar[str] = "A link changed state too often within the flap window."

    link_id: str
    topology_version: int
    changes: int
    window_s: float


class LinkRecovered(Event, frozen=True, kw_only=True, tag="io.ibpool.fabric.link.recovered.v1"):
    key_name: ClassVar[str] = "link_id"
    summary: ClassVar[str] = "A link problem cleared and stayed away for the clear window."

    link_id: str
    topology_version: int
    problem: LinkProblem
    quiet_s: float = 0.0
