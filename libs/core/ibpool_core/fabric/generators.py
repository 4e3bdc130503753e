"""Generated fabrics: pure functions of their parameters that return a checked `Topology`.

Every generator is deterministic: the same parameters give the same names, GUIDs, port numbers
and therefore the same `content_hash`. GUIDs are `0xb83fd2` (an NVIDIA OUI) followed by one byte
for the kind of node and 32 bits of index, so generated GUIDs never collide with each other.
Port numbers on a switch: host (down) ports first from 1, then uplinks, then the rest in order.
Parameter errors raise `ValueError` with the reason; the result always passes `build_topology`.

  single_switch      hosts on one switch
  fat_tree_2tier     leaf/spine with an oversubscription ratio at the leaf
  fat_tree_3tier     k-ary fat-tree (edge/aggregation/core) with an oversubscription ratio at the edge
  rail_optimised     NVIDIA DGX SuperPOD-style (8 rails, scalable units of 32 DGX H100, Quantum-2)
  torus_3d           X x Y x Z switches with wraparound, hosts on every switch
  dragonfly          groups of all-to-all routers joined by global links
"""

from __future__ import annotations

import math
from collections.abc import Callable

from ..gpu_model import DEFAULT_GPU_MODEL, GPU_MODELS
from .model import LANE_GBPS, WIDTHS, Ca, Gpu, Host, Link, Media, PortRef, Switch, Topology, build_topology

_OUI = 0xB83FD2
_KIND_SWITCH, _KIND_SPINE, _KIND_CORE, _KIND_HCA = 0x01, 0x02, 0x03, 0x10
QUANTUM2 = "Quantum-2 QM9700"  # NVIDIA Quantum-2: 64 ports of 400 Gb/s NDR, SHARPv3


def _guid(kind: int, index: int) -> str:
    return f"0x{(_OUI << 40) | (kind << 32) | index:016x}"


def _next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


class _Builder:
    """Accumulates nodes and cables; hands out the next free port of each node."""

    def __init__(self, *, speed: str, width: int, gpus_per_host: int, gpu_model: str, media: Media | None) -> None:
        _check(speed in LANE_GBPS, f"unknown speed {speed!r}; known: {', '.join(LANE_GBPS)}")
        _check(width in WIDTHS, f"width {width} is not one of {WIDTHS}")
        _check(gpus_per_host >= 0, "gpus_per_host must be >= 0")
        _check(gpu_model in GPU_MODELS, f"unknown GPU model {gpu_model!r}; known: {', '.join(GPU_MODELS)}")
        self.speed, self.width, self.media = speed, width, media
        self.gpus_per_host = gpus_per_host
        self.gpu_model = gpu_model
        self.memory_mib, _, _, self.mig = GPU_MODELS[gpu_model]
        self.switches: list[Switch] = []
        self.hosts: list[Host] = []
        self.cas: list[Ca] = []
        self.links: list[Link] = []
        self.radix: dict[str, int] = {}
        self.next_port: dict[str, int] = {}

    def switch(self, kind: int, index: int, name: str, radix: int, *, sharp: bool, model: str | None) -> str:
        guid = _guid(kind, index)
        self.switches.append(Switch(guid=guid, name=name, radix=radix, sharp=sharp, model=model))
        self.radix[guid] = radix
        self.next_port[guid] = 1
        return guid

    def host(self, name: str, index: int, rails: int) -> list[str]:
        """A host with its GPUs and `rails` single-port HCAs mlx5_0.. (rail index = HCA number)."""
        gpus = [
            Gpu(index=i, model=self.gpu_model, memory_mib=self.memory_mib, nvlink_domain=name, mig_capable=self.mig)
            for i in range(self.gpus_per_host)
        ]
        self.hosts.append(Host(name=name, gpus=gpus))
        guids = []
        for rail in range(rails):
            guid = _guid(_KIND_HCA, index * 16 + rail)
            self.cas.append(Ca(guid=guid, host=name, name=f"mlx5_{rail}", ports=1, rail=rail))
            self.radix[guid] = 1
            self.next_port[guid] = 1
            guids.append(guid)
        return guids

    def skip_to(self, guid: str, port: int) -> None:
        """The next cable on `guid` takes port `port` (leaves keep their uplinks after the host ports)."""
        self.next_port[guid] = max(self.next_port[guid], port)

    def cable(self, a: str, b: str, count: int = 1) -> None:
        for _ in range(count):
            pa, pb = self.next_port[a], self.next_port[b]
            for guid, port in ((a, pa), (b, pb)):
                if port > self.radix[guid]:
                    raise ValueError(f"internal: port {port} of {guid} is beyond its radix {self.radix[guid]}")
            self.next_port[a], self.next_port[b] = pa + 1, pb + 1
            self.links.append(
                Link(a=PortRef(a, pa), b=PortRef(b, pb), width=self.width, speed=self.speed, media=self.media)
            )

    def build(self, name: str) -> Topology:
        return build_topology(name=name, hosts=self.hosts, cas=self.cas, switches=self.switches, links=self.links)


def _host_name(prefix: str, index: int, total: int) -> str:
    return f"{prefix}{index + 1:0{max(3, len(str(total)))}d}"


def _split_ports(radix: int, oversubscription: float) -> tuple[int, int]:
    """(down, up) ports of a leaf for a down:up ratio: the most ports with down == ratio * up exactly."""
    _check(oversubscription >= 1.0, f"oversubscription must be >= 1 (down:up), not {oversubscription}")
    for up in range(radix // 2, 0, -1):
        down = up * oversubscription
        if abs(down - round(down)) < 1e-9 and round(down) + up <= radix:
            return round(down), up
    raise ValueError(f"no integral split of {radix} ports gives {oversubscription}:1")


def single_switch(
    hosts: int,
    radix: int = 64,
    *,
    speed: str = "NDR",
    width: int = 4,
    gpus_per_host: int = 8,
    gpu_model: str = DEFAULT_GPU_MODEL,
    sharp: bool = False,
    name: str | None = None,
) -> Topology:
    """`hosts` hosts (node001..) each with one HCA (rail 0) on one switch of `radix` ports."""
    _check(hosts >= 1, "hosts must be >= 1")
    _check(hosts <= radix, f"{hosts} hosts do not fit on one switch of radix {radix}")
    b = _Builder(speed=speed, width=width, gpus_per_host=gpus_per_host, gpu_model=gpu_model, media=None)
    sw = b.switch(_KIND_SWITCH, 1, "switch01", radix, sharp=sharp, model=None)
    for i in range(hosts):
        (ca,) = b.host(_host_name("node", i, hosts), i, 1)
        b.cable(ca, sw)
    return b.build(name or f"single-switch-{hosts}")


def fat_tree_2tier(
    hosts: int,
    radix: int = 64,
    oversubscription: float = 1.0,
    *,
    speed: str = "NDR",
    width: int = 4,
    gpus_per_host: int = 8,
    gpu_model: str = DEFAULT_GPU_MODEL,
    sharp: bool = False,
    name: str | None = None,
) -> Topology:
    """Leaf/spine fat-tree. Each leaf has `d` host ports and `u` uplinks with d:u = `oversubscription`
    (the most ports that give the ratio exactly: 64 ports at 1:1 -> 32/32, at 3:1 -> 48/16); there
    are `u` spines and every leaf has one cable to every spine. Leaves fill in order (leaf001 gets
    node001..), so only the last leaf may be partly used. At most `radix * d` hosts.
    Hop diameter between hosts on different leaves: 4. Bisection: hosts/2 * link rate / ratio."""
    _check(hosts >= 1, "hosts must be >= 1")
    down, up = _split_ports(radix, oversubscription)
    leaves = math.ceil(hosts / down)
    _check(
        leaves <= radix, f"{hosts} hosts need {leaves} leaves; a 2-tier fat-tree of radix {radix} has at most {radix}"
    )
    b = _Builder(speed=speed, width=width, gpus_per_host=gpus_per_host, gpu_model=gpu_model, media=None)
    spine_guids = [b.switch(_KIND_SPINE, j + 1, f"spine{j + 1:03d}", radix, sharp=sharp, model=None) for j in range(up)]
    for leaf in range(leaves):
        lg = b.switch(_KIND_SWITCH, leaf + 1, f"leaf{leaf + 1:03d}", radix, sharp=sharp, model=None)
        for i in range(leaf * down, min(hosts, (leaf + 1) * down)):
            (ca,) = b.host(_host_name("node", i, hosts), i, 1)
            b.cable(ca, lg)
        b.skip_to(lg, down + 1)
        for sg in spine_guids:
            b.cable(lg, sg)
    return b.build(name or f"fat-tree-2tier-{hosts}")


def fat_tree_3tier(
    hosts: int,
    radix: int = 64,
    oversubscription: float = 1.0,
    *,
    speed: str = "NDR",
    width: int = 4,
    gpus_per_host: int = 8,
    gpu_model: str = DEFAULT_GPU_MODEL,
    sharp: bool = False,
    name: str | None = None,
) -> Topology:
    """k-ary fat-tree (k = `radix`) with edge/aggregation/core tiers. An edge switch has `d` host
    ports and `u` uplinks (d:u = `oversubscription`, as in `fat_tree_2tier`); a pod has k/2 edges
    and `u` aggregation switches, each edge cabled once to each aggregation switch of its pod;
    aggregation switch j of every pod is cabled once to each of the k/2 cores of core group j.
    At 1:1 this is the textbook fat-tree: (k/2)^2 cores, up to k pods, k^3/4 hosts. Pods and edges
    fill in order. Hop diameter between hosts in different pods: 6. Bisection: hosts/2 * rate / ratio."""
    _check(hosts >= 1, "hosts must be >= 1")
    _check(radix >= 4 and radix % 2 == 0, "radix must be even and >= 4")
    down, up = _split_ports(radix, oversubscription)
    half = radix // 2
    per_pod = half * down
    pods = math.ceil(hosts / per_pod)
    _check(pods <= radix, f"{hosts} hosts need {pods} pods; a 3-tier fat-tree of radix {radix} has at most {radix}")
    b = _Builder(speed=speed, width=width, gpus_per_host=gpus_per_host, gpu_model=gpu_model, media=None)
    cores = [
        [
            b.switch(_KIND_CORE, j * half + c + 1, f"core-g{j + 1:02d}-{c + 1:02d}", radix, sharp=sharp, model=None)
            for c in range(half)
        ]
        for j in range(up)
    ]
    for pod in range(pods):
        aggs = [
            b.switch(_KIND_SPINE, pod * up + j + 1, f"agg-p{pod + 1:02d}-{j + 1:02d}", radix, sharp=sharp, model=None)
            for j in range(up)
        ]
        first = pod * per_pod
        edges = math.ceil((min(hosts, first + per_pod) - first) / down)
        for e in range(edges):
            eg = b.switch(
                _KIND_SWITCH, pod * half + e + 1, f"edge-p{pod + 1:02d}-{e + 1:02d}", radix, sharp=sharp, model=None
            )
            for i in range(first + e * down, min(hosts, first + (e + 1) * down)):
                (ca,) = b.host(_host_name("node", i, hosts), i, 1)
                b.cable(ca, eg)
            b.skip_to(eg, down + 1)
            for ag in aggs:
                b.cable(eg, ag)
        for j, ag in enumerate(aggs):
            b.skip_to(ag, half + 1)
            for cg in cores[j]:
                b.cable(ag, cg)
    return b.build(name or f"fat-tree-3tier-{hosts}")


# NVIDIA DGX SuperPOD, DGX H100 reference architecture (RA-11333-001; "Network Fabrics", Table 4
# "Compute fabric component count"): scalable units (SU) of 32 DGX H100, each with 8 compute HCAs
# (400 Gb/s NDR) on 8 rails; one Quantum-2 QM9700 leaf per rail per SU, so the 8 leaves of an SU
# each see every node of the SU ("traffic per rail is always one hop away from the other 31 nodes
# in a SU"), and traffic between SUs or rails goes through the spines. Published counts:
#     SUs  nodes  GPUs  leaf  spine  node+UFM cables  spine-leaf cables
#      1    31    248     8     4         252              256
#      2    63    504    16     8         508              512
#      3    95    760    24    16         764              768
#      4   127   1016    32    16        1020             1024
# (one DGX slot per fabric is given to the 4 UFM appliance cables: 127 * 8 + 4 = 1020; we do not
# model UFM). Spines are sized for the full design ("the fabric should be designed to support the
# full SU": 3 SUs get the 16 spines of 4). Larger SuperPODs add a core tier (DGX SuperPOD RA,
# Table 3 "Larger DGX SuperPOD component counts", same QM9700 fabric in the B200 edition):
#      8 SU: 64 leaf, 32 spine, no core;  16 SU: 128 leaf, 128 spine, 64 core;
#     32 SU: 256 leaf, 256 spine, 128 core;  64 SU: 512 leaf, 512 spine, 256 core (cables 1:1:1).
# Beyond what one core layer of 64-port switches can join at full bisection (64 pods = 256 SUs,
# 65,536 GPUs) each rail gets its own core layer (rail planes: cross-rail traffic goes over NVLink
# inside the host, as NCCL's PXN does); that is how the 12,500-node (100,000 GPU) bench fabric is built.
SUPERPOD_SU_SIZE = 32
SUPERPOD_RAILS = 8


def rail_optimised(
    hosts: int = 127,
    *,
    rails: int = SUPERPOD_RAILS,
    su_size: int = SUPERPOD_SU_SIZE,
    radix: int = 64,
    gpus_per_host: int = 8,
    gpu_model: str = DEFAULT_GPU_MODEL,
    speed: str = "NDR",
    width: int = 4,
    name: str | None = None,
) -> Topology:
    """A DGX SuperPOD-style rail-optimised fabric of `hosts` DGX nodes (dgx001..), all switches
    Quantum-2 QM9700 (`radix` 64, SHARP-capable), all cables optical `width`x`speed` (4xNDR).

    Host i is in SU i // su_size; its HCA mlx5_r (rail r) is cabled to leaf-su<s>-r<r>, whose
    first su_size ports are host ports and next radix/2 ports are uplinks. With L = rails * SUs leaves:
      L <= radix   two tiers: S = min(radix/2, next_pow2(L)/2) spines spine01..; every leaf has
                   radix/2 / S cables to every spine (4 SU: 32 leaves, 16 spines, 2 cables each).
      otherwise    three tiers: per rail, SUs are cut into blocks of radix/2 SUs; a pod is the leaves
                   of one rail in one block with P = next_pow2(min(SUs, radix/2)) spines
                   spine-b<b>-r<r>-<j>, every leaf cabled (radix/2)/P times to each pod spine; spine j
                   of every pod goes to core group j (N pods -> next_pow2(N)/2 cores per group,
                   radix/next_pow2(N) cables from each spine to each of them). When N > radix the
                   core groups are per rail (rail planes, core-r<r>-g<j>-<c>), else shared (core-g<j>-<c>).
    """
    _check(hosts >= 1, "hosts must be >= 1")
    _check(1 <= rails <= 16, "rails must be 1..16")
    _check(radix >= 4 and _next_pow2(radix) == radix, "radix must be a power of two >= 4")
    half = radix // 2
    _check(1 <= su_size <= half, f"su_size must be 1..{half} (a leaf has {half} host ports)")
    sus = math.ceil(hosts / su_size)
    n_leaves = rails * sus
    b = _Builder(speed=speed, width=width, gpus_per_host=gpus_per_host, gpu_model=gpu_model, media="optical")

    def switch(kind: int, index: int, name: str) -> str:
        return b.switch(kind, index, name, radix, sharp=True, model=QUANTUM2)

    leaf = [[switch(_KIND_SWITCH, s * 16 + r + 1, f"leaf-su{s + 1}-r{r}") for r in range(rails)] for s in range(sus)]
    for i in range(hosts):
        s, _slot = divmod(i, su_size)
        for r, ca in enumerate(b.host(_host_name("dgx", i, hosts), i, rails)):
            b.cable(ca, leaf[s][r])
    for row in leaf:
        for lg in row:
            b.skip_to(lg, su_size + 1)

    if n_leaves <= radix:
        n_spines = min(half, max(1, _next_pow2(n_leaves) // 2))
        spines = [switch(_KIND_SPINE, j + 1, f"spine{j + 1:02d}") for j in range(n_spines)]
        for row in leaf:
            for lg in row:
                for sg in spines:
                    b.cable(lg, sg, half // n_spines)
        return b.build(name or f"rail-optimised-{hosts}")

    blocks = math.ceil(sus / half)  # per rail
    per_pod = _next_pow2(min(sus, half))  # spines per pod
    pods = rails * blocks
    planes = _next_pow2(pods) > radix
    _check(
        not planes or _next_pow2(blocks) <= radix,
        f"{hosts} hosts need {blocks} pods per rail; one core layer of radix {radix} joins at most {radix}",
    )
    joined = blocks if planes else pods  # pods that one core group joins
    group_size = max(2, _next_pow2(joined)) // 2
    per_core = radix // max(2, _next_pow2(joined))
    n_core = 0

    def core_groups(prefix: str) -> list[list[str]]:
        nonlocal n_core
        groups = []
        for j in range(per_pod):
            group = []
            for c in range(group_size):
                n_core += 1
                group.append(switch(_KIND_CORE, n_core, f"core-{prefix}g{j + 1:02d}-{c + 1}"))
            groups.append(group)
        return groups

    shared = None if planes else core_groups("")
    n_spine = 0
    for r in range(rails):
        groups = core_groups(f"r{r}-") if shared is None else shared
        for blk in range(blocks):
            spines = []
            for j in range(per_pod):
                n_spine += 1
                spines.append(switch(_KIND_SPINE, n_spine, f"spine-b{blk + 1}-r{r}-{j + 1:02d}"))
            for s in range(blk * half, min(sus, (blk + 1) * half)):
                for sg in spines:
                    b.cable(leaf[s][r], sg, half // per_pod)
            for j, sg in enumerate(spines):
                b.skip_to(sg, half + 1)
                for cg in groups[j]:
                    b.cable(sg, cg, per_core)
    return b.build(name or f"rail-optimised-{hosts}")


def torus_3d(
    x: int,
    y: int,
    z: int,
    *,
    hosts_per_switch: int = 1,
    radix: int = 36,
    speed: str = "NDR",
    width: int = 4,
    gpus_per_host: int = 8,
    gpu_model: str = DEFAULT_GPU_MODEL,
    name: str | None = None,
) -> Topology:
    """A 3D torus of x*y*z switches torus-x<i>-y<j>-z<k>, each cabled to its +1 neighbour in every
    dimension of size >= 2 with wraparound (a dimension of 2 gives two cables between the pair), with
    `hosts_per_switch` hosts (node001.., one HCA each) on every switch. Host-to-host hop diameter:
    2 + floor(x/2) + floor(y/2) + floor(z/2)."""
    dims = (x, y, z)
    _check(all(d >= 1 for d in dims), "torus dimensions must be >= 1")
    _check(hosts_per_switch >= 1, "hosts_per_switch must be >= 1")
    need = hosts_per_switch + 2 * sum(1 for d in dims if d >= 2)
    _check(need <= radix, f"a torus switch needs {need} ports, more than radix {radix}")
    total = x * y * z * hosts_per_switch
    b = _Builder(speed=speed, width=width, gpus_per_host=gpus_per_host, gpu_model=gpu_model, media=None)
    grid: dict[tuple[int, int, int], str] = {}
    n = 0
    for i in range(x):
        for j in range(y):
            for k in range(z):
                sw = b.switch(_KIND_SWITCH, len(grid) + 1, f"torus-x{i}-y{j}-z{k}", radix, sharp=False, model=None)
                grid[(i, j, k)] = sw
                for _ in range(hosts_per_switch):
                    (ca,) = b.host(_host_name("node", n, total), n, 1)
                    b.cable(ca, sw)
                    n += 1
    for (i, j, k), sw in grid.items():
        for axis, size in enumerate(dims):
            if size < 2:
                continue
            coord = [i, j, k]
            coord[axis] = (coord[axis] + 1) % size
            b.cable(sw, grid[(coord[0], coord[1], coord[2])])
    return b.build(name or f"torus-{x}x{y}x{z}")


def dragonfly(
    groups: int,
    routers_per_group: int,
    hosts_per_router: int,
    global_links_per_router: int,
    *,
    radix: int = 64,
    speed: str = "NDR",
    width: int = 4,
    gpus_per_host: int = 8,
    gpu_model: str = DEFAULT_GPU_MODEL,
    name: str | None = None,
) -> Topology:
    """A dragonfly: `groups` groups of `routers_per_group` switches df-g<g>-r<r>, all-to-all inside
    a group (local links), `hosts_per_router` hosts on each, and up to `global_links_per_router`
    global links per switch. Global links are dealt pair by pair of groups, in rounds, each time
    from the switch of the group with the fewest global links so far, until no pair has a free
    port on both sides; the first round joins every pair of groups, so routers_per_group *
    global_links_per_router must be >= groups - 1. Host-to-host hop diameter: at most 5
    (host, local, global, local, host)."""
    g, a, p, h = groups, routers_per_group, hosts_per_router, global_links_per_router
    _check(g >= 1 and a >= 1 and p >= 1 and h >= 0, "groups, routers and hosts must be >= 1, global links >= 0")
    _check(a * h >= g - 1, f"{a} routers x {h} global links cannot join each of the {g} groups to every other")
    need = p + (a - 1) + h
    _check(need <= radix, f"a dragonfly switch needs {need} ports, more than radix {radix}")
    total = g * a * p
    b = _Builder(speed=speed, width=width, gpus_per_host=gpus_per_host, gpu_model=gpu_model, media=None)
    routers: list[list[str]] = []
    n = 0
    for gi in range(g):
        row = []
        for ri in range(a):
            sw = b.switch(_KIND_SWITCH, gi * a + ri + 1, f"df-g{gi}-r{ri}", radix, sharp=False, model=None)
            row.append(sw)
            for _ in range(p):
                (ca,) = b.host(_host_name("node", n, total), n, 1)
                b.cable(ca, sw)
                n += 1
        routers.append(row)
    for row in routers:
        for i in range(a):
            for j in range(i + 1, a):
                b.cable(row[i], row[j])
    used = [[0] * a for _ in range(g)]

    def free_router(gi: int) -> int | None:
        best = min(range(a), key=lambda ri: used[gi][ri])
        return best if used[gi][best] < h else None

    added = True
    while added:
        added = False
        for gi in range(g):
            for gj in range(gi + 1, g):
                fi, fj = free_router(gi), free_router(gj)
                if fi is None or fj is None:
                    continue
                b.cable(routers[gi][fi], routers[gj][fj])
                used[gi][fi] += 1
                used[gj][fj] += 1
                added = True
    return b.build(name or f"dragonfly-{g}x{a}x{p}")


GENERATORS: dict[str, Callable[..., Topology]] = {
    "single_switch": single_switch,
    "fat_tree_2tier": fat_tree_2tier,
    "fat_tree_3tier": fat_tree_3tier,
    "rail_optimised": rail_optimised,
    "torus_3d": torus_3d,
    "dragonfly": dragonfly,
}


def parse_spec(spec: str) -> tuple[str, dict[str, int | float | str]]:
    """`rail_optimised:hosts=16,rails=8` -> ("rail_optimised", {"hosts": 16, "rails": 8});
    `true`/`false` are bools (`fat_tree_2tier:hosts=64,sharp=true`)."""
    kind, _, params = spec.strip().partition(":")
    if kind not in GENERATORS:
        raise ValueError(f"unknown generator {kind!r}; known: {', '.join(GENERATORS)}")
    kwargs: dict[str, int | float | str] = {}
    for item in filter(None, (p.strip() for p in params.split(","))):
        key, eq, raw = item.partition("=")
        if not eq or not key:
            raise ValueError(f"generator parameter {item!r} is not key=value")
        value: int | float | str = raw
        if raw.lower() in ("true", "false"):  # a flag (`sharp=true`): a bool, never a truthy string
            kwargs[key.strip()] = raw.lower() == "true"
            continue
        for convert in (int, float):
            try:
                value = convert(raw)
                break
            except ValueError:
                continue
        kwargs[key.strip()] = value
    return kind, kwargs


def generate(spec: str) -> Topology:
    """A topology from a spec string (see `parse_spec`); ValueError names a bad kind or parameter."""
    kind, kwargs = parse_spec(spec)
    try:
        return GENERATORS[kind](**kwargs)
    except TypeError as e:
        raise ValueError(f"{kind}: {e}") from None
