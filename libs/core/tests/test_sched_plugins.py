"""Each built-in placement plugin as a table of (name, input, want)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from ibpool_core.fabric import generators as gen
from ibpool_core.fabric.index import FabricIndex
from ibpool_core.fabric.link_health import LinkState
from ibpool_core.sched.framework import Candidate, ClusterView, HostState, PlacementAsk, PreFilterResult, Telemetry
from ibpool_core.sched.plugins import default_registry
from ibpool_core.sched.plugins.data_locality import DataLocality
from ibpool_core.sched.plugins.filters import Fits, GpuModel, Health
from ibpool_core.sched.plugins.gang import GangBarrier, ReserveGpus
from ibpool_core.sched.plugins.scores import Load, Topology, make_link_health, make_load

H100 = "NVIDIA H100 80GB HBM3"
FAT = FabricIndex(gen.fat_tree_2tier(16, radix=8, sharp=True))  # 4 leaves x 4 hosts, SHARP everywhere
FAT_NO_SHARP = FabricIndex(gen.fat_tree_2tier(16, radix=8))
RAIL = FabricIndex(gen.rail_optimised(32, rails=4, su_size=8))  # 4 SUs x 8 hosts, 4 rails


def host(name: str = "node001", **kw: Any) -> HostState:
    base: dict[str, Any] = {"gpu_model": H100, "total_gpus": 8, "free_gpus": 8}
    return HostState(name=name, **(base | kw))


def ask(**kw: Any) -> PlacementAsk:
    return PlacementAsk(**({"job_id": "j", "gpus_per_host": 8} | kw))


def view(index: FabricIndex = FAT, hosts: list[HostState] | None = None, **kw: Any) -> ClusterView:
    return ClusterView(index, hosts if hosts is not None else [host(h) for h in index.hosts], **kw)


# ------------------------------------------------------------------------------------ filters

FILTER_CASES = [
    ("fits: enough free", Fits(), ask(gpus_per_host=4), host(free_gpus=4), None),
    ("fits: too few", Fits(), ask(gpus_per_host=8), host(free_gpus=7), "too few free GPUs"),
    ("health: ready", Health(), ask(), host(health="ready"), None),
    ("health: cordoned", Health(), ask(), host(health="cordoned"), "node cordoned"),
    ("health: suspect", Health(), ask(), host(health="suspect"), "node suspect"),
    ("health: failed", Health(), ask(), host(health="failed"), "node failed"),
    ("model: any", GpuModel(), ask(), host(gpu_model="NVIDIA L40S"), None),
    ("model: same", GpuModel(), ask(gpu_model=H100), host(), None),
    ("model: other", GpuModel(), ask(gpu_model=H100), host(gpu_model="NVIDIA L40S"), "other GPU model"),
    ("data: no dataset", DataLocality(), ask(), host(), None),
    ("data: preferred never filters", DataLocality(), ask(dataset="ds", data_locality="preferred"), host(), None),
    ("data: required, holder", DataLocality(), ask(dataset="ds", data_locality="required"), host("node001"), None),
    (
        "data: required, not a holder",
        DataLocality(),
        ask(dataset="ds", data_locality="required"),
        host("node002"),
        "does not hold the dataset",
    ),
]


@pytest.mark.parametrize(("name", "plugin", "the_ask", "the_host", "want"), FILTER_CASES)
def test_filters(name: str, plugin: Any, the_ask: PlacementAsk, the_host: HostState, want: str | None) -> None:
    v = view(hosts=[the_host], datasets={"ds": ["node001"]})
    assert plugin.filter(the_ask, v, the_host) == want, name


def test_fits_sees_this_cycles_reservations() -> None:
    v = view()
    h = v.hosts["node001"]
    assert Fits().filter(ask(gpus_per_host=8), v, h) is None
    assert v.hold("other", "node001", 2)
    assert Fits().filter(ask(gpus_per_host=8), v, h) == "too few free GPUs"
    assert Fits().filter(ask(gpus_per_host=6), v, h) is None


PRE_FILTER_CASES = [
    ("no dataset", ask(), PreFilterResult()),
    ("preferred", ask(dataset="ds", data_locality="preferred"), PreFilterResult()),
    ("required", ask(dataset="ds", data_locality="required"), PreFilterResult(hosts=frozenset({"node001", "node005"}))),
    (
        "required, held nowhere",
        ask(dataset="nope", data_locality="required"),
        PreFilterResult(reject="no host holds dataset 'nope'"),
    ),
]


@pytest.mark.parametrize(("name", "the_ask", "want"), PRE_FILTER_CASES)
def test_data_locality_pre_filter(name: str, the_ask: PlacementAsk, want: PreFilterResult) -> None:
    # the registry and the hosts' own lists are merged
    hosts = [host(h, datasets=("ds",) if h == "node005" else ()) for h in FAT.hosts]
    v = view(hosts=hosts, datasets={"ds": ["node001"]})
    assert DataLocality().pre_filter(the_ask, v) == want, name


# ------------------------------------------------------------------------------------- scores

HOT = Telemetry(gpu_util=1.0, temperature_c=90.0, memory_used=1.0)
WARM = Telemetry(gpu_util=0.5, temperature_c=65.0, memory_used=0.5)
COOL = Telemetry(gpu_util=0.0, temperature_c=30.0, memory_used=0.0)

LOAD_CASES = [
    ("not compute-heavy: no preference", ask(), HOT, 100.0),
    ("idle and cool", ask(compute_heavy=True), COOL, 100.0),
    ("busy, hot, full", ask(compute_heavy=True), HOT, 0.0),
    ("half way", ask(compute_heavy=True), WARM, 50.0),
    ("only hot", ask(compute_heavy=True), Telemetry(temperature_c=85.0), 70.0),
    ("out-of-range telemetry is clamped", ask(compute_heavy=True), Telemetry(gpu_util=3.0), 50.0),
]


@pytest.mark.parametrize(("name", "the_ask", "telemetry", "want"), LOAD_CASES)
def test_load(name: str, the_ask: PlacementAsk, telemetry: Telemetry, want: float) -> None:
    h = host(telemetry=telemetry)
    assert make_load({}).score_host(the_ask, view(hosts=[h]), h) == pytest.approx(want), name


def test_load_weights_from_args() -> None:
    only_temp = make_load({"w_util": 0, "w_mem": 0, "w_temp": 1})
    h = host(telemetry=Telemetry(gpu_util=1.0, temperature_c=45.0, memory_used=1.0))
    assert only_temp.score_host(ask(compute_heavy=True), view(hosts=[h]), h) == 100.0
    with pytest.raises(ValueError, match="not all 0"):
        Load(0, 0, 0, 45, 85)


LEAF_OF_NODE005 = FAT.leaf_of("node005")
LINK_CASES: list[tuple[str, dict[str, LinkState], str, float]] = [
    ("all up", {}, "node005", 100.0),
    ("leaf degraded", {str(LEAF_OF_NODE005): "degraded"}, "node005", 40.0),
    ("leaf flapping", {str(LEAF_OF_NODE005): "flapping"}, "node006", 10.0),
    ("other leaf flapping", {str(LEAF_OF_NODE005): "flapping"}, "node001", 100.0),
    ("own link down", {"node001": "down"}, "node001", 0.0),
    ("worst wins", {str(LEAF_OF_NODE005): "degraded", "node005": "flapping"}, "node005", 10.0),
]


@pytest.mark.parametrize(("name", "states", "name_of_host", "want"), LINK_CASES)
def test_link_health(name: str, states: dict[str, LinkState], name_of_host: str, want: float) -> None:
    v = view(link_state=states)
    assert make_link_health({}).score_host(ask(), v, v.hosts[name_of_host]) == want, name


@pytest.mark.parametrize(
    ("name", "args", "states", "nodes", "want"),
    [
        ("default: a gang member behind a down leaf uplink is refused", {}, {"leaf": "down"}, 2, "link down"),
        ("default: a degraded one is only scored", {}, {"leaf": "degraded"}, 2, None),
        ("default: single-host work is not filtered", {}, {"leaf": "down"}, 1, None),
        ("reject degraded too", {"reject": ["degraded", "down"]}, {"leaf": "degraded"}, 2, "link degraded"),
        ("single hosts too", {"single_hosts": 1}, {"node005": "down"}, 1, "link down"),
    ],
)
def test_link_health_as_a_hard_filter(
    name: str, args: dict[str, object], states: dict[str, LinkState], nodes: int, want: str | None
) -> None:
    states = {(str(LEAF_OF_NODE005) if k == "leaf" else k): v for k, v in states.items()}
    v = view(link_state=states)
    plugin = make_link_health(args)
    assert plugin.filter(ask(hosts=nodes), v, v.hosts["node005"]) == want, name
    with pytest.raises(ValueError, match="reject"):
        make_link_health({"reject": ["broken"]})


def test_link_health_marks_the_leaf_group_for_candidate_ordering() -> None:
    v = view(link_state={str(LEAF_OF_NODE005): "flapping"})
    assert v.bad_groups == {v.group_of["node005"]}


def cand(index: FabricIndex, hosts: list[str], min_level: int = 1, min_groups: int = 1) -> Candidate:
    groups = {index.subtree_of(h, 1).index for h in hosts}  # type: ignore[union-attr]
    return Candidate(
        hosts=tuple(hosts),
        covering=index.covering_subtree(hosts),
        leaf_groups=len(groups),
        min_level=min_level,
        min_leaf_groups=min_groups,
    )


TOPOLOGY_CASES = [
    # (name, index, ask, hosts, min_level, min_groups, want): mean of subtree, span, rails [, sharp] [, level]
    ("one leaf, single node", FAT, ask(), ["node001"], 1, 1, 100.0),
    ("one leaf, gang under SHARP", FAT, ask(hosts=2), ["node001", "node002"], 1, 1, 100.0),
    ("two leaves where one would do", FAT, ask(hosts=2), ["node001", "node005"], 1, 1, (50 + 50 + 100 + 100) / 4),
    ("two leaves needed", FAT, ask(hosts=5), ["node001", "node002", "node003", "node004", "node005"], 2, 2, 100.0),
    (
        "no SHARP on the fabric",
        FAT_NO_SHARP,
        ask(hosts=2),
        ["node001", "node002"],
        1,
        1,
        (100 + 100 + 100 + 0) / 4,
    ),
    ("opted out of SHARP", FAT_NO_SHARP, ask(hosts=2, wants_sharp=False), ["node001", "node002"], 1, 1, 100.0),
    (
        "preferred level missed",
        FAT,
        ask(hosts=2, topology_level=1),
        ["node001", "node005"],
        1,
        1,
        (50 + 50 + 100 + 100 + 0) / 5,
    ),
    ("rail-optimised SU", RAIL, ask(hosts=3), ["dgx001", "dgx002", "dgx003"], 1, 1, 100.0),
]


@pytest.mark.parametrize(("name", "index", "the_ask", "hosts", "min_level", "min_groups", "want"), TOPOLOGY_CASES)
def test_topology(
    name: str,
    index: FabricIndex,
    the_ask: PlacementAsk,
    hosts: list[str],
    min_level: int,
    min_groups: int,
    want: float,
) -> None:
    score = Topology().score_gang(the_ask, view(index), cand(index, hosts, min_level, min_groups))
    assert score == pytest.approx(want), name


def test_topology_rail_alignment() -> None:
    # a host cabled on 2 of the 4 rails: the members share 2 of the 4 rails any of them has
    topo = gen.rail_optimised(32, rails=4, su_size=8)
    dropped = {c.guid for c in topo.cas if c.host == "dgx002" and (c.rail or 0) >= 2}
    links = [msgspec.structs.replace(ln, state="down") if {ln.a.guid, ln.b.guid} & dropped else ln for ln in topo.links]
    cut = msgspec.structs.replace(topo, links=links)
    index = FabricIndex(cut)
    assert index.rails("dgx002") == (0, 1)
    score = Topology().score_gang(ask(hosts=2), view(index), cand(index, ["dgx001", "dgx002"]))
    assert score == pytest.approx((100 + 100 + 50 + 100) / 4)


def test_data_locality_score() -> None:
    v = view(datasets={"ds": ["node001"]})
    dl = DataLocality()
    assert dl.score_host(ask(dataset="ds"), v, v.hosts["node001"]) == 100.0
    assert dl.score_host(ask(dataset="ds"), v, v.hosts["node002"]) == 0.0
    assert dl.score_host(ask(), v, v.hosts["node002"]) == 100.0
    assert dl.score_host(ask(dataset="ds", data_locality="required"), v, v.hosts["node002"]) == 100.0


# --------------------------------------------------------------------------- reserve and permit


def test_reserve_gpus_holds_and_gives_back() -> None:
    v = view()
    r = ReserveGpus()
    assert r.reserve(ask(job_id="a"), v, "node001", 6) is None
    assert v.free("node001") == 2 and dict(v.held("a")) == {"node001": 6}
    assert r.reserve(ask(job_id="b"), v, "node001", 4) == "2 free GPUs, 4 needed"
    assert dict(v.held("b")) == {}
    r.unreserve(ask(job_id="a"), v, "node001")
    r.unreserve(ask(job_id="a"), v, "node001")  # nothing held: a no-op
    assert v.free("node001") == 8 and dict(v.held("a")) == {}


BARRIER_CASES = [
    ("all members", {"node001": 8, "node002": 8}, "allow", ""),
    ("one missing", {"node001": 8}, "wait", "1 of 2 members reserved"),
    ("none", {}, "wait", "0 of 2 members reserved"),
    ("wrong size", {"node001": 8, "node002": 4}, "reject", "node002 holds 4 GPUs, not 8"),
    ("too many", {"node001": 8, "node002": 8, "node003": 8}, "reject", "3 hosts held for a gang of 2"),
]


@pytest.mark.parametrize(("name", "held", "kind", "reason"), BARRIER_CASES)
def test_gang_barrier(name: str, held: dict[str, int], kind: str, reason: str) -> None:
    v = view()
    for h, g in held.items():
        assert v.hold("j", h, g)
    verdict = GangBarrier(timeout_s=0).permit(ask(hosts=2), v, list(held))
    assert (verdict.kind, verdict.reason) == (kind, reason), name


def test_registry_lists_every_builtin() -> None:
    assert default_registry().names() == [
        "binpack",
        "data-locality",
        "fits",
        "gang-barrier",
        "gpu-model",
        "gpus",
        "health",
        "link-health",
        "load",
        "topology",
    ]
    with pytest.raises(ValueError, match="already registered"):
        default_registry().register("fits", lambda args: Fits())
