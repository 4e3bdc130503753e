"""The structure under a topology: who is cabled to whom, which switches are leaves, switch tiers.

Tiers are computed from the graph, never guessed from names: a leaf (tier 1) is a switch with a
host adapter cabled to it; every other switch's tier is one more than its distance to the
nearest leaf. Aggregation-node adapters (SHARP) are not hosts and do not make a switch a leaf.
"""

from __future__ import annotations

from collections import deque

from .model import Topology


class Graph:
    """Adjacency of a topology, built once (O(links))."""

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        self.switches = {s.guid: s for s in topology.switches}
        self.routers = {r.guid: r for r in topology.routers}
        self.cas = {c.guid: c for c in topology.cas}
        # switch GUID -> neighbouring switch GUIDs (with multiplicity: parallel cables count)
        self.switch_links: dict[str, list[str]] = {g: [] for g in self.switches}
        # CA GUID -> switches it is cabled to; switch GUID -> CAs cabled to it
        self.ca_switches: dict[str, list[str]] = {g: [] for g in self.cas}
        self.switch_cas: dict[str, list[str]] = {g: [] for g in self.switches}
        for link in topology.links:
            a, b = link.a.guid, link.b.guid
            if a in self.switches and b in self.switches:
                if a != b:
                    self.switch_links[a].append(b)
                    self.switch_links[b].append(a)
            elif a in self.switches and b in self.cas:
                self.switch_cas[a].append(b)
                self.ca_switches[b].append(a)
            elif b in self.switches and a in self.cas:
                self.switch_cas[b].append(a)
                self.ca_switches[a].append(b)

    def leaves(self) -> list[str]:
        return sorted(g for g, cas in self.switch_cas.items() if cas)

    def tiers(self) -> dict[str, int]:
        """Switch GUID -> tier (1 = leaf). Switches that reach no leaf get tier 0."""
        tier: dict[str, int] = {}
        queue: deque[str] = deque()
        for leaf in self.leaves():
            tier[leaf] = 1
            queue.append(leaf)
        while queue:
            g = queue.popleft()
            for n in self.switch_links[g]:
                if n not in tier:
                    tier[n] = tier[g] + 1
                    queue.append(n)
        return {g: tier.get(g, 0) for g in self.switches}

    def host_leaves(self) -> dict[str, list[str]]:
        """Host name -> the leaf switches its adapters are cabled to (sorted, unique)."""
        out: dict[str, set[str]] = {h.name: set() for h in self.topology.hosts}
        for ca_guid, switches in self.ca_switches.items():
            out[self.cas[ca_guid].host].update(switches)
        return {h: sorted(s) for h, s in out.items()}

    def leaf_hosts(self) -> dict[str, list[str]]:
        """Leaf switch GUID -> host names cabled to it (sorted)."""
        out: dict[str, set[str]] = {g: set() for g in self.leaves()}
        for g in out:
            for ca in self.switch_cas[g]:
                out[g].add(self.cas[ca].host)
        return {g: sorted(h) for g, h in out.items()}
