"""Fabric domain: the InfiniBand topology and the state of its links."""

from __future__ import annotations

from typing import ClassVar, Literal

from .message import Event

LinkState = Literal["up", "down", "degraded", "flapping"]


class TopologyPublished(Event, frozen=True, kw_only=True, tag="io.ibpool.fabric.topology.published.v1"):
    key_name: ClassVar[str] = "fabric"
    summary: ClassVar[str] = "A new immutable topology version exists."

    version: int
    content_hash: str
    hosts: int
    switches: int
    links: int


class LinkStateChanged(Event, frozen=True, kw_only=True, tag="io.ibpool.fabric.link.changed.v1"):
    key_name: ClassVar[str] = "link_id"
    summary: ClassVar[str] = "A fabric link changed state (up, down, degraded, flapping)."

    link_id: str
    state: LinkState
    previous_state: LinkState
    topology_version: int
    reason: str = ""


class LinkDegraded(Event, frozen=True, kw_only=True, tag="io.ibpool.fabric.link.degraded.v1"):
    key_name: ClassVar[str] = "link_id"
    summary: ClassVar[str] = "A link's error counters or rate crossed the degradation threshold."

    link_id: str
    topology_version: int
    symbol_errors_per_min: float = 0.0
    active_rate_gbps: float | None = None
    expected_rate_gbps: float | None = None
    reason: str = ""
