"""What is derived from a topology, fast enough to ask per scheduling decision at 100,000 GPUs.

`FabricIndex(topology)` is built once per topology version (O(links)) and then answers:

* tiers (from `graph.Graph`), leaves, the rails of a host and the leaf of a host on a rail;
* `hops` and `bottleneck_gbps` between two hosts, per rail or best over the rails both have;
* subtrees: `subtrees(level)`, `leaf_groups()`, `covering_subtree(hosts)`, `blocks(n)`,
  `bisection_gbps(subtree)`, `sharp_subtrees()`.

Conventions, used by every method:

Paths. A path runs over switches only (InfiniBand does not forward through hosts, and routers join
subnets, so they are not crossed). A link whose state is "down" is not part of the index; the other
states count with their recorded width x speed. Build a new index for a new topology version.

Rails. An adapter's rail is `Ca.rail`; an adapter without one gets its position among its host's
adapters ordered by (name, GUID), i.e. mlx5_0 -> 0, mlx5_1 -> 1 (the "port order" rule).

Levels. Let tier(s) be the switch tier of `Graph.tiers()` (1 = leaf, t = 1 + distance to the nearest
leaf). The level-k *switch components* are the connected components of the switch subgraph induced
by the switches of tier <= k (k = 1 .. max tier). The level-k *subtrees* are the connected components
of the same subgraph with the hosts added, each host joined to the leaves of all its adapters: a host
joins its rails. On a single-rail fabric both are the same thing; on a rail-optimised fabric the
level-1 subtree of a scalable unit is its 8 rail leaves with its 32 hosts (each of them one hop from
the others on every rail), whereas each level-1 switch component is one leaf. Subtrees are nested:
every level-k subtree lies inside one level-(k+1) subtree. Hosts with no cabled adapter are in no subtree.

Distances. For two distinct leaves a, b whose lowest common switch-component level is k >= 2, every
path has at least 2(k-1) links (it must reach a switch of tier >= k, at least k-1 links from any
leaf), and exactly 2(k-1) when some tier-k switch lies strictly above both (reachable by links that
each go up one tier). That holds for every pair in a fat-tree, so `hops` is O(1) there; any other
pair (torus, dragonfly, irregular fabrics, leaves joined by leaf-to-leaf links) falls back to a
breadth-first search from the leaf, cached per source leaf.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence

import msgspec

from .graph import Graph
from .model import LANE_GBPS, Topology

_BFS_CACHE_INTS = 4_000_000  # switch distances kept by the per-source BFS cache (about 32 MB)
_PAIR_CACHE_MAX = 1_000_000  # entries of each pair cache before it is cleared


class Subtree(msgspec.Struct, frozen=True, kw_only=True):
    """One subtree of a `FabricIndex` (see the module docstring for levels).

    level     1 .. index.levels
    index     its position in `FabricIndex.subtrees(level)` (ordered by first host name)
    switches  GUIDs of its switches, sorted
    hosts     names of its hosts, sorted
    sharp     True when every one of its switches is SHARP-capable
    """

    level: int
    index: int
    switches: tuple[str, ...]
    hosts: tuple[str, ...]
    sharp: bool


class _UnionFind:
    def __init__(self, n: int) -> None:
        self.parent = list(range(n))

    def find(self, x: int) -> int:
        parent = self.parent
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def union(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            if ra < rb:
                self.parent[rb] = ra
            else:
                self.parent[ra] = rb


def _bits(mask: int) -> list[int]:
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out


class FabricIndex:
    """Derived, read-only answers about one topology. Build once per version; methods never mutate it
    except for internal caches. Unknown host names raise KeyError; other impossibilities return None."""

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        links = topology.links
        if any(link.state == "down" for link in links):
            links = [link for link in links if link.state != "down"]
            topology = msgspec.structs.replace(topology, links=links)
        graph = Graph(topology)
        self.graph = graph
        #: switch GUID -> tier (1 = leaf, 0 = reaches no leaf), from `Graph.tiers()` over the usable links
        self.tiers: dict[str, int] = graph.tiers()

        sw_guids = [s.guid for s in topology.switches]
        self._sw_guids = sw_guids
        sw_idx = {g: i for i, g in enumerate(sw_guids)}
        n_sw = len(sw_guids)
        tier = [self.tiers[g] for g in sw_guids]
        self._tier = tier
        self._sharp = [s.sharp for s in topology.switches]
        self.levels: int = max(tier, default=0)
        """The highest level (= the highest switch tier); 0 when there is no leaf."""

        # Hosts and their adapters (rails by the port-order rule).
        host_names = [h.name for h in topology.hosts]
        self._host_names = host_names
        host_idx = {name: i for i, name in enumerate(host_names)}
        self._host_idx = host_idx
        cas_of: list[list[tuple[str, str, int | None]]] = [[] for _ in host_names]
        for ca in topology.cas:
            cas_of[host_idx[ca.host]].append((ca.name, ca.guid, ca.rail))
        ca_host_rail: dict[str, tuple[int, int]] = {}
        for hi, items in enumerate(cas_of):
            items.sort()
            for pos, (_name, guid, rail) in enumerate(items):
                ca_host_rail[guid] = (hi, pos if rail is None else rail)

        # One pass over the links: switch adjacency (best cable per neighbour), capacity towards the
        # next tier up, and host attachments (host, rail) -> {leaf: best cable gbps}.
        adj: list[dict[int, float]] = [{} for _ in range(n_sw)]
        up_cap = [0.0] * n_sw
        same_tier_links = 0
        attach: list[dict[int, dict[int, float]]] = [{} for _ in host_names]
        host_cap = [0.0] * len(host_names)
        lane = LANE_GBPS
        for link in links:
            ga, gb = link.a.guid, link.b.guid
            ia, ib = sw_idx.get(ga), sw_idx.get(gb)
            w = link.width * lane[link.speed]
            if ia is not None and ib is not None:
                if ia == ib:
                    continue
                na = adj[ia]
                if w > na.get(ib, 0.0):
                    na[ib] = w
                    adj[ib][ia] = w
                ta, tb = tier[ia], tier[ib]
                if ta == tb:
                    same_tier_links += 1
                elif tb == ta + 1:
                    up_cap[ia] += w
                elif ta == tb + 1:
                    up_cap[ib] += w
                continue
            if ia is not None:
                sw, ca_guid = ia, gb
            elif ib is not None:
                sw, ca_guid = ib, ga
            else:
                continue
            hr = ca_host_rail.get(ca_guid)
            if hr is None:
                continue
            hi, rail = hr
            per_rail = attach[hi].setdefault(rail, {})
            if w > per_rail.get(sw, 0.0):
                per_rail[sw] = w
            host_cap[hi] += w
        self._adj = adj
        self._max_w = max((w for na in adj for w in na.values()), default=0.0)
        self._up_cap = up_cap
        self._host_cap = host_cap
        #: True when no link joins two switches of the same tier (fat-trees); then every subtree's
        #: bisection is defined and `hops` never needs a search
        self.tree_like: bool = same_tier_links == 0

        # Per host: rail -> sorted leaf indices, and a group id shared by hosts cabled alike.
        self._rail_leaves: list[dict[int, tuple[int, ...]]] = []
        self._attach: list[dict[int, dict[int, float]]] = attach
        self._host_group: list[int] = []
        groups: dict[tuple[tuple[int, tuple[tuple[int, float], ...]], ...], int] = {}
        for per in attach:
            self._rail_leaves.append({r: tuple(sorted(m)) for r, m in sorted(per.items())})
            sig = tuple((r, tuple(sorted(m.items()))) for r, m in sorted(per.items()))
            self._host_group.append(groups.setdefault(sig, len(groups)))
        self._group_rep = [0] * len(groups)
        for hi in range(len(host_names) - 1, -1, -1):
            self._group_rep[self._host_group[hi]] = hi

        self._build_levels(n_sw, len(host_names))
        self._build_ancestors(n_sw)
        self._bfs_cache: dict[int, tuple[list[int], list[float]]] = {}
        self._cables: list[dict[int, int]] | None = None  # `uplinks`, built on first use
        self._sw_pos: dict[str, int] | None = None
        self._bfs_cache_max = max(16, _BFS_CACHE_INTS // max(1, n_sw))
        self._up_cache: dict[int, dict[int, float]] = {}
        self._group_hops: dict[tuple[int, int], int | None] = {}
        self._leaf_bw_cache: dict[tuple[int, int], float | None] = {}
        self._group_bw: dict[tuple[int, int], float | None] = {}

    # ----------------------------------------------------------------------------------- building

    def _build_levels(self, n_sw: int, n_hosts: int) -> None:
        tier, adj, K = self._tier, self._adj, self.levels
        edges_at: list[list[tuple[int, int]]] = [[] for _ in range(K + 1)]
        for u in range(n_sw):
            tu = tier[u]
            if tu == 0:
                continue
            for v in adj[u]:
                if u < v:
                    edges_at[max(tu, tier[v])].append((u, v))
        # switch components (paths) and subtrees (hosts join their leaves): one union-find each
        pure = _UnionFind(n_sw)
        joined = _UnionFind(n_sw + n_hosts)
        for hi, per in enumerate(self._rail_leaves):
            for leaves in per.values():
                for leaf in leaves:
                    joined.union(n_sw + hi, leaf)
        self._pure_comp: list[list[int]] = [[]]  # [level][switch] -> component id or -1
        self._joined_comp: list[list[int]] = [[]]  # [level][switch] -> subtree index or -1
        self._host_comp: list[list[int]] = [[]]  # [level][host] -> subtree index or -1
        self._subtrees: list[list[Subtree]] = [[]]
        host_names, sw_guids, sharp = self._host_names, self._sw_guids, self._sharp
        for k in range(1, K + 1):
            for u, v in edges_at[k]:
                pure.union(u, v)
                joined.union(u, v)
            in_level = [0 < t <= k for t in tier]
            ids: dict[int, int] = {}
            pc = [ids.setdefault(pure.find(s), len(ids)) if in_level[s] else -1 for s in range(n_sw)]
            self._pure_comp.append(pc)
            # subtrees, numbered by their first host (hosts are sorted by name)
            roots: dict[int, int] = {}
            members_h: list[list[int]] = []
            hc = [-1] * n_hosts
            for hi in range(n_hosts):
                if not self._rail_leaves[hi]:
                    continue
                r = joined.find(n_sw + hi)
                c = roots.get(r)
                if c is None:
                    c = roots[r] = len(members_h)
                    members_h.append([])
                members_h[c].append(hi)
                hc[hi] = c
            members_s: list[list[int]] = [[] for _ in members_h]
            jc = [-1] * n_sw
            for s in range(n_sw):
                if in_level[s]:
                    c = roots.get(joined.find(s), -1)
                    if c >= 0:
                        members_s[c].append(s)
                        jc[s] = c
            self._joined_comp.append(jc)
            self._host_comp.append(hc)
            self._subtrees.append(
                [
                    Subtree(
                        level=k,
                        index=c,
                        switches=tuple(sw_guids[s] for s in members_s[c]),
                        hosts=tuple(host_names[h] for h in members_h[c]),
                        sharp=all(sharp[s] for s in members_s[c]),
                    )
                    for c in range(len(members_h))
                ]
            )
        # per leaf: its switch-component id at every level (index level - 1)
        self._leaf_comps: dict[int, tuple[int, ...]] = {
            s: tuple(self._pure_comp[k][s] for k in range(1, K + 1)) for s in range(n_sw) if tier[s] == 1
        }

    def _build_ancestors(self, n_sw: int) -> None:
        """Per leaf and level k: bit mask (over tier-k switches) of the switches strictly above it."""
        tier, adj, K = self._tier, self._adj, self.levels
        pos: list[int] = [0] * n_sw
        by_tier: list[list[int]] = [[] for _ in range(K + 1)]
        for s in range(n_sw):
            t = tier[s]
            if t:
                pos[s] = len(by_tier[t])
                by_tier[t].append(s)
        self._by_tier = by_tier
        self._pos = pos
        leaves = by_tier[1] if K else []
        masks: list[list[int]] = [[1 << pos[s] for s in leaves]]
        for k in range(2, K + 1):
            below = by_tier[k - 1]
            up_mask = []
            for s in below:
                m = 0
                for t in adj[s]:
                    if tier[t] == k:
                        m |= 1 << pos[t]
                up_mask.append(m)
            memo: dict[int, int] = {}
            row = []
            for prev in masks[-1]:
                hit = memo.get(prev)
                if hit is None:
                    hit = 0
                    for p in _bits(prev):
                        hit |= up_mask[p]
                    memo[prev] = hit
                row.append(hit)
            masks.append(row)
        # clear[s]: every strictly-upward path from s runs at full speed (the fabric's best link), so
        # the bottleneck between two such leaves with a common ancestor is that speed, no search needed
        clear = [True] * n_sw
        for k in range(K - 1, 0, -1):
            for s in by_tier[k]:
                clear[s] = all(w >= self._max_w and clear[t] for t, w in adj[s].items() if tier[t] == k + 1)
        self._clear = clear
        self._anc: dict[int, tuple[int, ...]] = {
            leaf: tuple(masks[k][i] for k in range(K)) for i, leaf in enumerate(leaves)
        }

    # ------------------------------------------------------------------------------ basic lookups

    @property
    def hosts(self) -> tuple[str, ...]:
        """All host names, sorted."""
        return tuple(self._host_names)

    @property
    def leaves(self) -> tuple[str, ...]:
        """GUIDs of the leaf switches (tier 1), sorted."""
        return tuple(self._sw_guids[s] for s in self._by_tier[1]) if self.levels else ()

    def _host(self, name: str) -> int:
        try:
            return self._host_idx[name]
        except KeyError:
            raise KeyError(f"unknown host {name!r}") from None

    def rails(self, host: str) -> tuple[int, ...]:
        """The rails on which `host` has an adapter cabled to a switch, ascending. KeyError if unknown."""
        return tuple(self._rail_leaves[self._host(host)])

    def leaf_of(self, host: str, rail: int = 0) -> str | None:
        """GUID of the leaf that `host`'s adapter on `rail` is cabled to (the lowest GUID if several);
        None if the host has no cabled adapter on that rail. KeyError if the host is unknown."""
        leaves = self._rail_leaves[self._host(host)].get(rail)
        return self._sw_guids[leaves[0]] if leaves else None

    def leaves_of(self, host: str) -> dict[int, tuple[str, ...]]:
        """rail -> GUIDs of the leaves `host`'s adapters on that rail are cabled to."""
        return {r: tuple(self._sw_guids[s] for s in ls) for r, ls in self._rail_leaves[self._host(host)].items()}

    # ------------------------------------------------------------------------------- distances

    def _bfs(self, src: int) -> tuple[list[int], list[float]]:
        """Distances (links) and widest shortest-path bandwidth from switch `src` to every switch."""
        hit = self._bfs_cache.get(src)
        if hit is not None:
            return hit
        adj = self._adj
        n = len(adj)
        dist = [-1] * n
        bw = [0.0] * n
        dist[src], bw[src] = 0, math.inf
        queue = deque([src])
        while queue:
            u = queue.popleft()
            du, bu = dist[u] + 1, bw[u]
            for v, w in adj[u].items():
                dv = dist[v]
                if dv < 0:
                    dist[v] = du
                    bw[v] = bu if bu < w else w
                    queue.append(v)
                elif dv == du:
                    c = bu if bu < w else w
                    if c > bw[v]:
                        bw[v] = c
        if len(self._bfs_cache) >= self._bfs_cache_max:
            del self._bfs_cache[next(iter(self._bfs_cache))]
        self._bfs_cache[src] = (dist, bw)
        return dist, bw

    def _common_level(self, a: int, b: int) -> int:
        """0-based level index of the lowest switch component holding leaves a and b; -1 if none."""
        ca, cb = self._leaf_comps[a], self._leaf_comps[b]
        for k in range(len(ca)):
            if ca[k] == cb[k]:
                return k
        return -1

    def _leaf_dist(self, a: int, b: int) -> int | None:
        """Links on a shortest path between leaves a and b; None if not connected."""
        if a == b:
            return 0
        ca, cb = self._leaf_comps[a], self._leaf_comps[b]
        for k in range(len(ca)):
            if ca[k] == cb[k]:
                break
        else:
            return None
        if k and self._anc[a][k] & self._anc[b][k]:
            return 2 * k
        d = self._bfs(a)[0][b]
        return d if d >= 0 else None

    def _rail_hops(self, i: int, j: int, rail: int) -> int | None:
        la, lb = self._rail_leaves[i].get(rail), self._rail_leaves[j].get(rail)
        if not la or not lb:
            return None
        best: int | None = None
        for a in la:
            for b in lb:
                d = self._leaf_dist(a, b)
                if d is not None and (best is None or d < best):
                    best = d
        return None if best is None else best + 2

    def _best_hops(self, i: int, j: int) -> int | None:
        """min over the rails both hosts have. Lower bound: 2k, k the lowest level of a subtree holding
        both hosts (a switch component holding both leaves lies inside it), so the rails are tried in
        order only until one meets the bound (the first, on a fat-tree or rail-optimised fabric)."""
        ri, rj = self._rail_leaves[i], self._rail_leaves[j]
        rails = [r for r in ri if r in rj]
        if not rails:
            return None
        for k in range(1, self.levels + 1):
            comps = self._host_comp[k]
            if comps[i] == comps[j]:
                bound = 2 * k
                break
        else:
            return None  # no subtree holds both: no path on any rail
        best: int | None = None
        for rail in rails:
            d = self._rail_hops(i, j, rail)
            if d is not None and (best is None or d < best):
                best = d
                if d <= bound:
                    break
        return best

    def hops(self, h1: str, h2: str, rail: int | None = None) -> int | None:
        """Links on a shortest path from `h1`'s adapter on `rail` to `h2`'s adapter on `rail`,
        counting both host links (same leaf = 2, leaf-spine-leaf = 4, 3-tier = 6). With `rail`
        None: the smallest value over the rails both hosts have. 0 when h1 == h2 (and the rail
        exists); None when a host has no cabled adapter on the rail, they share no rail, or no path
        joins them. KeyError for an unknown host. O(1) on fat-trees (cached search otherwise)."""
        i, j = self._host(h1), self._host(h2)
        if rail is not None:
            if i == j:
                return 0 if self._rail_leaves[i].get(rail) else None
            return self._rail_hops(i, j, rail)
        if i == j:
            return 0 if self._rail_leaves[i] else None
        gi, gj = self._host_group[i], self._host_group[j]
        key = (gi, gj) if gi <= gj else (gj, gi)
        cache = self._group_hops
        if key in cache:
            return cache[key]
        d = self._best_hops(self._group_rep[key[0]], self._group_rep[key[1]]) if gi != gj else self._best_hops(i, j)
        if len(cache) >= _PAIR_CACHE_MAX:
            cache.clear()
        cache[key] = d
        return d

    def _up_bw(self, leaf: int) -> dict[int, float]:
        """Switch -> widest strictly-upward path bandwidth from `leaf` (all its ancestors)."""
        hit = self._up_cache.get(leaf)
        if hit is not None:
            return hit
        tier, adj = self._tier, self._adj
        out: dict[int, float] = {leaf: math.inf}
        frontier = [leaf]
        for k in range(2, self.levels + 1):
            nxt: dict[int, float] = {}
            for s in frontier:
                bs = out[s]
                for t, w in adj[s].items():
                    if tier[t] == k:
                        c = bs if bs < w else w
                        if c > nxt.get(t, -1.0):
                            nxt[t] = c
            out.update(nxt)
            frontier = list(nxt)
        if len(self._up_cache) >= 4096:
            del self._up_cache[next(iter(self._up_cache))]
        self._up_cache[leaf] = out
        return out

    def _leaf_bw(self, a: int, b: int) -> float | None:
        """Best min-link bandwidth over shortest leaf-to-leaf paths (inf for the same leaf)."""
        if a == b:
            return math.inf
        key = (a, b) if a < b else (b, a)
        cache = self._leaf_bw_cache
        if key in cache:
            return cache[key]
        k = self._common_level(a, b)
        result: float | None
        if k < 0:
            result = None
        elif k and self._clear[a] and self._clear[b] and self._anc[a][k] & self._anc[b][k]:
            result = self._max_w
        elif k and (common := self._anc[a][k] & self._anc[b][k]):
            ua, ub = self._up_bw(a), self._up_bw(b)
            top = self._by_tier[k + 1]
            result = 0.0
            for p in _bits(common):
                s = top[p]
                x, y = ua[s], ub[s]
                c = x if x < y else y
                if c > result:
                    result = c
                    if c >= self._max_w:
                        break
        else:
            dist, bw = self._bfs(a)
            result = bw[b] if dist[b] >= 0 else None
        if len(cache) >= _PAIR_CACHE_MAX:
            cache.clear()
        cache[key] = result
        return result

    def _rail_bw(self, i: int, j: int, rail: int) -> float | None:
        ma, mb = self._attach[i].get(rail), self._attach[j].get(rail)
        if not ma or not mb:
            return None
        if len(ma) > 1 or len(mb) > 1:  # several leaves on the rail: only the nearest pairs count
            dists = {(a, b): self._leaf_dist(a, b) for a in ma for b in mb}
            near = min((d for d in dists.values() if d is not None), default=None)
            pairs = [ab for ab, d in dists.items() if d is not None and d == near]
        else:
            pairs = [(next(iter(ma)), next(iter(mb)))]
        best: float | None = None
        for a, b in pairs:
            core = self._leaf_bw(a, b)
            if core is None:
                continue
            c = min(ma[a], mb[b], core)
            if best is None or c > best:
                best = c
        return best

    def bottleneck_gbps(self, h1: str, h2: str, rail: int | None = None) -> float | None:
        """The best, over shortest paths between the two hosts' adapters on `rail`, of the smallest
        link bandwidth on the path (Gb/s, width x lane rate, both host links included; parallel
        cables: the best one). With `rail` None: the best over the rails both hosts have. None when
        there is no path, a host lacks the rail, or h1 == h2 (no link between an adapter and itself).
        KeyError for an unknown host. Cached per leaf pair."""
        i, j = self._host(h1), self._host(h2)
        if i == j:
            return None
        if rail is not None:
            return self._rail_bw(i, j, rail)
        gi, gj = self._host_group[i], self._host_group[j]
        key = (gi, gj) if gi <= gj else (gj, gi)
        cache = self._group_bw
        if key in cache:
            return cache[key]
        best: float | None = None
        for r in self._attach[i]:
            c = self._rail_bw(i, j, r)
            if c is not None and (best is None or c > best):
                best = c
        if len(cache) >= _PAIR_CACHE_MAX:
            cache.clear()
        cache[key] = best
        return best

    # -------------------------------------------------------------------------------- subtrees

    def subtrees(self, level: int) -> list[Subtree]:
        """The level-`level` subtrees (1 .. levels), ordered by their first host name."""
        if not 1 <= level <= self.levels:
            raise ValueError(f"level must be 1..{self.levels}, not {level}")
        return list(self._subtrees[level])

    def leaf_groups(self) -> list[Subtree]:
        """The level-1 subtrees: leaves joined by the hosts cabled to them (one leaf and its hosts on a
        single-rail fat-tree; the rail leaves and hosts of one scalable unit on a rail-optimised one)."""
        return self.subtrees(1) if self.levels else []

    def subtree_of(self, host: str, level: int) -> Subtree | None:
        """The level-`level` subtree holding `host`; None if it has no cabled adapter."""
        if not 1 <= level <= self.levels:
            raise ValueError(f"level must be 1..{self.levels}, not {level}")
        c = self._host_comp[level][self._host(host)]
        return self._subtrees[level][c] if c >= 0 else None

    def covering_subtree(self, hosts: Iterable[str]) -> Subtree | None:
        """The lowest-level subtree that holds every host in `hosts` (the smallest one: subtrees are
        nested). None when no subtree holds them all (disconnected, or a host with no cabled adapter).
        ValueError for an empty set, KeyError for an unknown host. O(len(hosts) * levels)."""
        idx = [self._host(h) for h in hosts]
        if not idx:
            raise ValueError("covering_subtree needs at least one host")
        first = idx[0]
        for k in range(1, self.levels + 1):
            comps = self._host_comp[k]
            c = comps[first]
            if c < 0:
                return None
            for i in idx:
                if comps[i] != c:
                    break
            else:
                return self._subtrees[k][c]
        return None

    def blocks(self, n: int) -> list[tuple[str, ...]]:
        """Groups of exactly `n` hosts for Slurm's block topology (topology/block: equal base blocks).

        Rule: take the lowest level k at which some subtree has >= n hosts (k = 1 unless n exceeds
        every leaf group); in each level-k subtree, order the hosts by their level-1 .. level-(k-1)
        subtree (so hosts that share a lower subtree stay together) and then by name, and cut them
        into consecutive groups of n. A remainder of fewer than n hosts is in no block, and so are
        the hosts of subtrees smaller than n. Blocks are ordered by subtree, then position."""
        if n < 1:
            raise ValueError("block size must be >= 1")
        for k in range(1, self.levels + 1):
            if any(len(t.hosts) >= n for t in self._subtrees[k]):
                break
        else:
            return []
        out: list[tuple[str, ...]] = []
        for t in self._subtrees[k]:
            if len(t.hosts) < n:
                continue
            names = sorted(t.hosts, key=lambda h: (*(self._host_comp[j][self._host_idx[h]] for j in range(1, k)), h))
            out.extend(tuple(names[i : i + n]) for i in range(0, len(names) - n + 1, n))
        return out

    def bisection_gbps(self, subtree: Subtree) -> float | None:
        """Bisection bandwidth of a subtree, in Gb/s, by the uniform-tree formula:

            N/2 * min over levels j in 0 .. level-1 at which the subtree holds >= 2 level-j parts
                  of (min over those parts of up-capacity(part) / hosts(part))

        where N is the subtree's host count, a level-0 part is one host (up-capacity: the summed
        bandwidth of its adapters' links) and a level-j part is a level-j subtree inside it
        (up-capacity: the summed bandwidth of all cables from its tier-j switches to tier j+1).
        For a fat-tree (full or oversubscribed at any tier) this is the textbook value: the cut
        between two halves of the hosts must carry half of them across the narrowest level, so a
        full-bisection fabric gives N/2 * link rate and an r:1 leaf gives N/2 * rate / r.
        Returns 0.0 for fewer than 2 hosts, and None for a subtree that is not tree-like (it has a
        link between two switches of the same tier, as a torus or dragonfly does), where levels do
        not describe the cuts."""
        k = subtree.level
        if not 1 <= k <= self.levels or subtree.index >= len(self._subtrees[k]):
            raise ValueError("not a subtree of this index")
        if self._subtrees[k][subtree.index] != subtree:
            raise ValueError("not a subtree of this index")
        hosts = [self._host_idx[h] for h in subtree.hosts]
        if len(hosts) < 2:
            return 0.0
        switches = [i for i, c in enumerate(self._joined_comp[k]) if c == subtree.index]
        tier = self._tier
        for s in switches:
            ts = tier[s]
            for t in self._adj[s]:
                if tier[t] == ts:
                    return None
        ratio = min(self._host_cap[h] for h in hosts)
        for j in range(1, k):
            comps = self._host_comp[j]
            count: dict[int, int] = {}
            for h in hosts:
                count[comps[h]] = count.get(comps[h], 0) + 1
            if len(count) < 2:
                continue
            cap: dict[int, float] = dict.fromkeys(count, 0.0)
            jc = self._joined_comp[j]
            for s in switches:
                if tier[s] == j:
                    cap[jc[s]] += self._up_cap[s]
            ratio = min(ratio, min(cap[c] / count[c] for c in count))
        return len(hosts) / 2 * ratio

    def sharp_subtrees(self) -> list[Subtree]:
        """Every subtree (any level) all of whose switches are SHARP-capable, largest first (by host
        count, then lower level first, then index). A subtree that is the same at several levels
        (nothing joins it higher up) is listed once, at its lowest level."""
        seen: set[tuple[tuple[str, ...], tuple[str, ...]]] = set()
        out: list[Subtree] = []
        for k in range(1, self.levels + 1):
            for t in self._subtrees[k]:
                if t.sharp and (t.switches, t.hosts) not in seen:
                    seen.add((t.switches, t.hosts))
                    out.append(t)
        out.sort(key=lambda t: (-len(t.hosts), t.level, t.index))
        return out

    def uplinks(self, switch: str) -> dict[str, int]:
        """The switches one tier above `switch` that it is cabled to, each with the number of usable
        cables between the two (parallel cables counted); {} for a top-tier switch. KeyError if
        `switch` is not a switch of the fabric. The counts are built once per index (O(links))."""
        if self._cables is None:
            sw_idx = {g: i for i, g in enumerate(self._sw_guids)}
            cables: list[dict[int, int]] = [{} for _ in self._sw_guids]
            tier = self._tier
            for link in self.topology.links:
                if link.state == "down":
                    continue
                a, b = sw_idx.get(link.a.guid), sw_idx.get(link.b.guid)
                if a is None or b is None or a == b:
                    continue
                if tier[b] == tier[a] + 1:
                    cables[a][b] = cables[a].get(b, 0) + 1
                elif tier[a] == tier[b] + 1:
                    cables[b][a] = cables[b].get(a, 0) + 1
            self._cables = cables
        i = self._sw_index(switch)
        return {self._sw_guids[j]: n for j, n in sorted(self._cables[i].items())}

    def switch_tier(self, switch: str) -> int:
        """The tier of `switch` (1 = leaf; 0: it reaches no leaf). KeyError if not a switch of the fabric."""
        return self._tier[self._sw_index(switch)]

    def switch_sharp(self, switch: str) -> bool:
        """Whether `switch` is SHARP-capable (an aggregation node). KeyError if not a switch of the fabric."""
        return self._sharp[self._sw_index(switch)]

    def _sw_index(self, switch: str) -> int:
        if self._sw_pos is None:
            self._sw_pos = {g: i for i, g in enumerate(self._sw_guids)}
        try:
            return self._sw_pos[switch]
        except KeyError:
            raise KeyError(f"unknown switch {switch!r}") from None

    def host_distance_matrix(self, hosts: Sequence[str], rail: int | None = None) -> list[list[int | None]]:
        """`hops` for every pair of `hosts` (row i, column j), for placement scoring."""
        return [[self.hops(a, b, rail) for b in hosts] for a in hosts]
