"""The topology model: hosts (with their HCAs and GPUs), switches, routers and the links between ports.

A `Topology` is an immutable value. Every change makes a new one; `content_hash()` identifies
its content (the version number is given by whoever stores it). Identity is the node GUID
(lower-case hex with `0x`, as ibnetdiscover prints it); hosts are known by name and own one or
more channel adapters (CAs), one per rail on rail-optimised (DGX-class) hosts.
"""

from __future__ import annotations

import hashlib
import re
from typing import Literal

import msgspec

# Per-lane signalling rate in Gb/s, as InfiniBand names the speeds (4xNDR = 400 Gb/s).
LANE_GBPS: dict[str, float] = {
    "SDR": 2.5,
    "DDR": 5.0,
    "QDR": 10.0,
    "FDR10": 10.0,
    "FDR": 14.0625,
    "EDR": 25.0,
    "HDR": 50.0,
    "NDR": 100.0,
    "XDR": 200.0,
}
WIDTHS = (1, 2, 4, 8, 12)

LinkState = Literal["up", "down", "degraded", "flapping"]
Media = Literal["copper", "optical"]


class FabricError(Exception):
    """The topology is not valid; the message says what and where."""


def normalize_guid(guid: str | int) -> str:
    """`0x0002c903000e0b72`, whatever form it came in (int, with or without 0x, any case)."""
    value = guid if isinstance(guid, int) else int(str(guid).strip().lower().removeprefix("0x"), 16)
    if not 0 <= value < 1 << 64:
        raise FabricError(f"GUID {guid!r} is not a 64-bit value")
    return f"0x{value:016x}"


class PortRef(msgspec.Struct, frozen=True, array_like=True, order=True):
    """One port of one node: (node GUID, port number). Port 0 is a switch's management port."""

    guid: str
    port: int


class Link(msgspec.Struct, frozen=True, kw_only=True):
    """A cable between two ports. Its identity is the unordered pair of ports (`link_id`)."""

    a: PortRef
    b: PortRef
    width: int = 4
    speed: str = "NDR"
    state: LinkState = "up"
    media: Media | None = None

    @property
    def gbps(self) -> float:
        return self.width * LANE_GBPS[self.speed]

    @property
    def ends(self) -> tuple[PortRef, PortRef]:
        return (self.a, self.b) if self.a <= self.b else (self.b, self.a)

    @property
    def link_id(self) -> str:
        lo, hi = self.ends
        return f"{lo.guid}:{lo.port}-{hi.guid}:{hi.port}"


class Gpu(msgspec.Struct, frozen=True, kw_only=True):
    index: int
    model: str
    memory_mib: int
    nvlink_domain: str | None = None
    mig_capable: bool = False


class Ca(msgspec.Struct, frozen=True, kw_only=True):
    """A channel adapter (HCA) of a host. `rail` is its rail index on rail-optimised hosts."""

    guid: str
    host: str
    name: str = ""
    ports: int = 1
    rail: int | None = None


# A host known only by its adapter: ibnetdiscover's id `H-<16 hex digits>` of an adapter whose
# description names no host (a generic "MT4129 ConnectX7 Mellanox Technologies"). Kept in the
# native format; the host-level exports (Slurm, Kubernetes, Volcano) leave such hosts out.
_UNNAMED_HOST = re.compile(r"^H-[0-9a-fA-F]{16}$")


def unnamed_host(name: str) -> bool:
    """True for a host named only by its adapter's GUID (`H-0002c90300080e84`)."""
    return bool(_UNNAMED_HOST.match(name))


class Host(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    gpus: list[Gpu] = []


class Switch(msgspec.Struct, frozen=True, kw_only=True):
    guid: str
    name: str
    radix: int
    sharp: bool = False
    model: str | None = None


class Router(msgspec.Struct, frozen=True, kw_only=True):
    guid: str
    name: str
    radix: int


class Topology(msgspec.Struct, frozen=True, kw_only=True):
    """The whole fabric. Lists are kept sorted by identity so equal fabrics encode equally."""

    name: str = "fabric"
    hosts: list[Host] = []
    cas: list[Ca] = []
    switches: list[Switch] = []
    routers: list[Router] = []
    links: list[Link] = []
    warnings: list[str] = []


def build_topology(
    *,
    name: str = "fabric",
    hosts: list[Host] | None = None,
    cas: list[Ca] | None = None,
    switches: list[Switch] | None = None,
    routers: list[Router] | None = None,
    links: list[Link] | None = None,
    warnings: list[str] | None = None,
) -> Topology:
    """A checked, canonically ordered Topology; FabricError names the first inconsistency."""
    hosts, cas, switches, routers, links = hosts or [], cas or [], switches or [], routers or [], links or []
    radix: dict[str, int] = {}
    for kind, items in (("switch", switches), ("router", routers)):
        for node in items:
            if node.guid in radix:
                raise FabricError(f"duplicated GUID {node.guid} ({kind} {node.name!r})")
            radix[node.guid] = node.radix
    host_names = {h.name for h in hosts}
    if len(host_names) != len(hosts):
        dup = sorted({h.name for h in hosts if [x.name for x in hosts].count(h.name) > 1})
        raise FabricError(f"duplicated host name(s): {', '.join(dup)}")
    for ca in cas:
        if ca.guid in radix:
            raise FabricError(f"duplicated GUID {ca.guid} (CA {ca.name!r} of host {ca.host!r})")
        if ca.host not in host_names:
            raise FabricError(f"CA {ca.guid} belongs to unknown host {ca.host!r}")
        radix[ca.guid] = ca.ports
    used: dict[PortRef, str] = {}
    for link in links:
        if link.speed not in LANE_GBPS:
            raise FabricError(f"link {link.link_id}: unknown speed {link.speed!r}; known: {', '.join(LANE_GBPS)}")
        if link.width not in WIDTHS:
            raise FabricError(f"link {link.link_id}: width {link.width}x is not one of {WIDTHS}")
        for end in (link.a, link.b):
            if end.guid not in radix:
                raise FabricError(f"link {link.link_id} ends at unknown GUID {end.guid}")
            if not 1 <= end.port <= radix[end.guid]:
                raise FabricError(
                    f"link {link.link_id}: port {end.port} of {end.guid} is beyond its {radix[end.guid]} ports"
                )
            if end in used:
                raise FabricError(f"port {end.guid}:{end.port} is cabled twice ({used[end]} and {link.link_id})")
            used[end] = link.link_id
    return Topology(
        name=name,
        hosts=sorted(hosts, key=lambda h: h.name),
        cas=sorted(cas, key=lambda c: c.guid),
        switches=sorted(switches, key=lambda s: s.guid),
        routers=sorted(routers, key=lambda r: r.guid),
        links=sorted(links, key=lambda ln: ln.ends),
        warnings=list(warnings or []),
    )


def content_hash(topology: Topology) -> str:
    """sha256 of the canonical encoding, warnings excluded: the same fabric hashes the same."""
    canonical = msgspec.structs.replace(topology, warnings=[])
    return hashlib.sha256(msgspec.json.encode(canonical)).hexdigest()


class TopologyDiff(msgspec.Struct, frozen=True, kw_only=True):
    hosts_added: list[str] = []
    hosts_removed: list[str] = []
    hosts_changed: list[str] = []
    switches_added: list[str] = []
    switches_removed: list[str] = []
    switches_changed: list[str] = []
    links_added: list[str] = []
    links_removed: list[str] = []
    links_changed: list[str] = []

    @property
    def empty(self) -> bool:
        return not any(msgspec.structs.astuple(self))


def diff(old: Topology, new: Topology) -> TopologyDiff:
    """What changed from `old` to `new`, by identity (host name, switch GUID, link ports)."""

    def host_view(t: Topology) -> dict[str, object]:
        cas_by_host: dict[str, list[Ca]] = {}
        for ca in t.cas:
            cas_by_host.setdefault(ca.host, []).append(ca)
        return {h.name: (h, cas_by_host.get(h.name, [])) for h in t.hosts}

    def compare(a: dict[str, object], b: dict[str, object]) -> tuple[list[str], list[str], list[str]]:
        return (
            sorted(b.keys() - a.keys()),
            sorted(a.keys() - b.keys()),
            sorted(k for k in a.keys() & b.keys() if a[k] != b[k]),
        )

    ha, hr, hc = compare(host_view(old), host_view(new))
    sa, sr, sc = compare({s.guid: s for s in old.switches}, {s.guid: s for s in new.switches})
    la, lr, lc = compare({ln.link_id: ln for ln in old.links}, {ln.link_id: ln for ln in new.links})
    return TopologyDiff(
        hosts_added=ha,
        hosts_removed=hr,
        hosts_changed=hc,
        switches_added=sa,
        switches_removed=sr,
        switches_changed=sc,
        links_added=la,
        links_removed=lr,
        links_changed=lc,
    )


def rename_hosts(topology: Topology, names: dict[str, str]) -> Topology:
    """The same fabric with hosts renamed (old -> new; hosts not in `names` keep theirs)."""
    new_names = [names.get(h.name, h.name) for h in topology.hosts]
    if len(set(new_names)) != len(new_names):
        raise FabricError("renaming would give two hosts the same name")
    return build_topology(
        name=topology.name,
        hosts=[msgspec.structs.replace(h, name=names.get(h.name, h.name)) for h in topology.hosts],
        cas=[msgspec.structs.replace(c, host=names.get(c.host, c.host)) for c in topology.cas],
        switches=topology.switches,
        routers=topology.routers,
        links=topology.links,
        warnings=topology.warnings,
    )
