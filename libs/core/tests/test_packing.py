"""The packing view: fit rules, allocate/release, the framework, and each policy's choice."""

from __future__ import annotations

import random

import pytest

from ibpool_core.pool.fragmentation import WorkloadMix
from ibpool_core.pool.mig import MigInstance, is_valid
from ibpool_core.pool.packing import (
    WHOLE,
    NodeSpec,
    Option,
    Packer,
    PackingCluster,
    PackingError,
    PackRequest,
    choose,
    fit_options,
)
from ibpool_core.pool.policies import POLICIES, Fgd, FgdPlus, make_policy, register

H100 = "NVIDIA H100 80GB HBM3"


def node(name: str, gpus: int = 2, cpu: int = 16000, mem: int = 64000, model: str = "T4", gmem: int = 0) -> NodeSpec:
    return NodeSpec(name=name, cpu_milli=cpu, memory_mib=mem, gpu_model=model, gpus=gpus, gpu_memory_mib=gmem)


def frac(milli: int, cpu: int = 1000, mem: int = 1000, models: str = "", gmem: int = 0) -> PackRequest:
    return PackRequest(
        cpu_milli=cpu,
        memory_mib=mem,
        num_gpu=1,
        gpu_milli=milli,
        gpu_memory_mib=gmem,
        gpu_models=PackRequest.models_from_spec(models),
    )


def whole(n: int, cpu: int = 1000, mem: int = 1000) -> PackRequest:
    return PackRequest(cpu_milli=cpu, memory_mib=mem, num_gpu=n)


def used(cluster: PackingCluster, n: int, g: int, milli: int) -> None:
    """Take `milli` of GPU g of node n with a zero-CPU fraction (test set-up)."""
    cluster.allocate_gpus(n, PackRequest(num_gpu=1, gpu_milli=milli), (g,))


# ---------------------------------------------------------------- requests


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_gpu": -1}, "num_gpu"),
        ({"num_gpu": 1, "gpu_milli": 0}, "gpu_milli"),
        ({"num_gpu": 1, "gpu_milli": 1001}, "gpu_milli"),
        ({"num_gpu": 2, "gpu_milli": 500}, "num_gpu == 1"),
        ({"cpu_milli": -5}, "negative"),
        ({"num_gpu": 2, "mig_profile": "1g.10gb"}, "num_gpu must be 1"),
        ({"num_gpu": 1, "mig_profile": "9g.1tb"}, "no GPU model"),
        ({"num_gpu": 1, "gpu_milli": 500, "mig_profile": "1g.10gb"}, "counts 142"),
    ],
)
def test_bad_requests_say_why(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(PackingError, match=message):
        PackRequest(**kwargs)  # type: ignore[arg-type]


def test_gpu_spec_and_demand() -> None:
    assert PackRequest.models_from_spec("V100M16|V100M32") == {"V100M16", "V100M32"}
    assert PackRequest.models_from_spec("") == frozenset() == PackRequest.models_from_spec("nan")
    assert frac(470).gpu_demand_milli == 470 and whole(4).gpu_demand_milli == 4000
    assert PackRequest.mig_instance("3g.40gb").gpu_milli == 428
    assert frac(470) == frac(470) and hash(frac(470)) == hash(frac(470))  # one type


# ---------------------------------------------------------------- fit rules


def test_fit_rules() -> None:
    c = PackingCluster(
        [
            node("a", gpus=4, cpu=8000, mem=32000, model="V100M16", gmem=16000),
            node("b", gpus=2, cpu=8000, mem=32000, model="T4"),
            node("h", gpus=2, cpu=8000, mem=32000, model=H100, gmem=81559),
        ]
    )
    used(c, 0, 0, 600)  # a: 400, 1000, 1000, 1000 free
    used(c, 0, 1, 300)  # a: 400, 700, 1000, 1000
    used(c, 2, 1, 100)  # h: GPU 1 shared by a fraction: cannot be partitioned
    cases: list[tuple[str, int, PackRequest, list[Option]]] = [
        # a fraction: one option per distinct GPU state that has room, most free first
        ("fraction, room on three states", 0, frac(350), [Option((0,)), Option((2,)), Option((3,))]),
        ("fraction, only whole GPUs left", 0, frac(800), [Option((0,))]),
        ("fraction, cpu short", 0, frac(100, cpu=9000), []),
        ("fraction, memory short", 0, frac(100, mem=40000), []),
        ("fraction, model allowed", 0, frac(100, models="V100M16|V100M32"), [Option((0,)), Option((2,)), Option((3,))]),
        ("fraction, model not allowed", 1, frac(100, models="V100M16|V100M32"), []),
        ("fraction, GPU memory needed", 0, frac(100, gmem=16001), []),
        # whole GPUs: only entirely free ones count
        ("two whole GPUs", 0, whole(2), [Option((0, 1))]),
        ("three whole GPUs: two are shared", 0, whole(3), []),
        ("whole GPUs beyond the node", 1, whole(4), []),
        ("no GPU", 1, PackRequest(cpu_milli=8000, memory_mib=32000), [Option(())]),
        # MIG: a free GPU of a MIG-capable model, every start of the profile
        ("MIG on H100", 2, PackRequest.mig_instance("3g.40gb"), [Option((0,), 0), Option((0,), 4)]),
        ("MIG on a T4", 1, PackRequest.mig_instance("3g.40gb"), []),
        ("fraction on H100 still fine", 2, frac(500), [Option((0,)), Option((1,))]),
    ]
    for name, n, req, want in cases:
        assert fit_options(c, c.state(n), req) == want, name


def test_mig_layouts_fit_and_refuse() -> None:
    c = PackingCluster(
        [node("h", gpus=1, model=H100, gmem=81559)], mig_layouts={(0, 0): [MigInstance(profile="4g.40gb", start=0)]}
    )
    st = c.state(0)
    assert st.gpus[0][0] == WHOLE - 571 and st.gpus[0][2] == (("4g.40gb", 0),)
    assert fit_options(c, st, PackRequest.mig_instance("3g.40gb")) == [Option((0,), 4)]
    assert fit_options(c, st, PackRequest.mig_instance("4g.40gb")) == []
    assert fit_options(c, st, frac(100)) == []  # a partitioned GPU takes no plain fraction
    assert fit_options(c, st, whole(1)) == []
    p = c.allocate(0, PackRequest.mig_instance("3g.40gb"), Option((0,), 4))
    layout = [MigInstance(profile=q, start=s) for q, s in c.state(0).gpus[0][2]]
    assert is_valid(H100, layout) and p.mig_start == 4 and p.gpu_milli == 428
    assert fit_options(c, c.state(0), PackRequest.mig_instance("1g.10gb")) == []
    with pytest.raises(PackingError, match="does not fit"):
        c.allocate_gpus(0, PackRequest.mig_instance("1g.10gb"), (0,), 6)
    with pytest.raises(PackingError, match="invalid MIG layout"):
        PackingCluster([node("h", gpus=1, model=H100)], mig_layouts={(0, 0): [MigInstance(profile="4g.40gb", start=4)]})


def test_allocate_and_release_round_trip() -> None:
    c = PackingCluster([node("a", gpus=4), node("b", gpus=4), node("h", gpus=1, model=H100, gmem=81559)])
    before = [c.state(n) for n in range(3)]
    groups = {k: set(v) for k, v in c.groups.items()}
    reqs = [frac(300), frac(500), whole(2), PackRequest.mig_instance("1g.10gb", cpu_milli=10)]
    done = []
    for r in reqs:
        n = 2 if r.mig_profile else 0
        opts = fit_options(c, c.state(n), r)
        done.append((c.allocate(n, r, opts[-1]), r))
    assert c.allocated_milli == 300 + 500 + 2000 + 142
    assert c.state(0) != before[0] and c.state(1) == before[1]
    assert c.groups[c.state(1)] == {1} and c.group_min[c.state(0)] == 0
    for p, r in reversed(done):
        c.release(p, r)
    assert [c.state(n) for n in range(3)] == before and c.allocated_milli == 0
    assert {k: set(v) for k, v in c.groups.items()} == groups


@pytest.mark.parametrize(
    ("gpus", "req", "message"),
    [
        ((0,), whole(1), "not entirely free"),
        ((0, 0), whole(2), "distinct"),
        ((9,), frac(100), "no GPU"),
        ((1,), frac(100, cpu=99999), "cpu or memory"),
        ((1,), frac(100, models="A100"), "not one of"),
        ((1,), PackRequest.mig_instance("1g.10gb"), "no MIG profile"),
    ],
)
def test_allocate_refuses_what_does_not_fit(gpus: tuple[int, ...], req: PackRequest, message: str) -> None:
    c = PackingCluster([node("a", gpus=2)])
    used(c, 0, 0, 100)
    before = c.state(0)
    with pytest.raises(PackingError, match=message):
        c.allocate_gpus(0, req, gpus)
    assert c.state(0) == before


def test_equal_nodes_share_one_state() -> None:
    c = PackingCluster([node(f"n{i}", gpus=8, cpu=96000, mem=393216, model="G2") for i in range(5)])
    assert len(c.groups) == 1 and c.groups[c.state(3)] == {0, 1, 2, 3, 4}
    used(c, 2, 5, 470)
    assert len(c.groups) == 2 and c.group_min[c.state(0)] == 0 and c.groups[c.state(2)] == {2}


# ---------------------------------------------------------------- policies


def test_registry() -> None:
    assert list(POLICIES) == ["first-fit", "best-fit", "worst-fit", "dot-product", "fgd", "fgd+"]
    assert make_policy("fgd+").name == "fgd+"
    with pytest.raises(ValueError, match="unknown policy 'nope'; known: first-fit"):
        make_policy("nope")
    with pytest.raises(ValueError, match="already registered"):
        register("fgd", Fgd)
    for name, factory in POLICIES.items():
        doc = factory.__doc__ or ""
        assert "Filter" in doc and "Score" in doc and "Pick" in doc, f"{name}: contract missing from its docstring"


def _three_nodes() -> PackingCluster:
    c = PackingCluster([node("a"), node("b", gpus=8, cpu=64000, mem=256000), node("c")])
    used(c, 0, 0, 400)  # a: 600, 1000 free
    used(c, 2, 0, 700)  # c: 300, 1000 free
    return c


def _gpu_of(c: PackingCluster, n: int, option: Option) -> int:
    p = c.allocate(n, PackRequest(num_gpu=1, gpu_milli=1), option)  # which GPU the option is
    return p.gpus[0]


# (policy, request, workload mix for fgd/fgd+, wanted node, wanted GPU on it)
R = frac(250, cpu=2000, mem=4000)
POLICY_CASES: list[tuple[str, PackRequest, list[tuple[PackRequest, int]], int, int]] = [
    ("first-fit", R, [], 0, 1),  # lowest node; its most free GPU
    ("best-fit", R, [], 2, 0),  # least CPU+GPU left (c), tightest GPU (300 free)
    ("worst-fit", R, [], 1, 0),  # the empty 8-GPU node
    ("dot-product", R, [], 0, 0),  # a: 0.2875 vs c: 0.26875 vs b: 0.078; tightest GPU
    # mix of 400-milli tasks: 600 -> 350 would make a fragment (+350); 300 -> 50 shrinks one (-250)
    ("fgd", R, [(frac(400, cpu=1000), 1)], 2, 0),
    ("fgd+", R, [(frac(400, cpu=1000), 1)], 2, 0),
    # mix of 250-milli tasks: F stays 0 on a, b, and on c's free GPU (c's 300 -> 50 would make a
    # fragment); fgd takes the lowest such node, fgd+ the fullest (best-fit tie-break)
    ("fgd", R, [(R, 1)], 0, 1),
    ("fgd+", R, [(R, 1)], 2, 1),
]


@pytest.mark.parametrize(("policy", "req", "mix", "want_node", "want_gpu"), POLICY_CASES)
def test_policy_choice(
    policy: str, req: PackRequest, mix: list[tuple[PackRequest, int]], want_node: int, want_gpu: int
) -> None:
    c = _three_nodes()
    pol = {"fgd": Fgd, "fgd+": FgdPlus}[policy](WorkloadMix.fixed(mix)) if mix else make_policy(policy)
    got = choose(c, pol, req)
    assert got is not None
    n, option = got
    assert (n, _gpu_of(c, n, option)) == (want_node, want_gpu)


def test_whole_gpus_prefer_the_node_they_fill_under_fgd() -> None:
    # an 8-GPU node with 6 free and a 2-GPU node with 2 free: taking the 2-GPU node keeps the
    # 8-GPU node able to run 4-GPU tasks; best-fit agrees, worst-fit does not
    c = PackingCluster([node("big", gpus=8, cpu=64000, mem=256000), node("small")])
    used(c, 0, 0, WHOLE)
    used(c, 0, 1, WHOLE)
    mix = WorkloadMix.fixed([(whole(4), 1), (whole(2), 1)])
    assert choose(c, Fgd(mix), whole(2)) == (1, Option((0, 1)))
    assert choose(c, make_policy("best-fit"), whole(2)) == (1, Option((0, 1)))
    assert choose(c, make_policy("worst-fit"), whole(2)) == (0, Option((0, 1)))


def test_nothing_fits_is_none() -> None:
    c = _three_nodes()
    for name in POLICIES:
        assert choose(c, make_policy(name), whole(9)) is None
        assert Packer(c, make_policy(name)).place(whole(9)) is None


def _random_cluster(rng: random.Random) -> PackingCluster:
    shapes = [
        (2, 16000, 64000, "P100"),
        (8, 96000, 393216, "G2"),
        (4, 32000, 131072, "V100M16"),
        (1, 8000, 61440, H100),
    ]
    specs = []
    for i in range(14):
        g, cpu, mem, model = rng.choice(shapes)
        specs.append(NodeSpec(name=f"n{i}", cpu_milli=cpu, memory_mib=mem, gpu_model=model, gpus=g, leaf=f"l{i % 3}"))
    return PackingCluster(specs)


def _random_requests(rng: random.Random) -> list[PackRequest]:
    kinds = [
        frac(470, cpu=8000, mem=30000),
        frac(810, cpu=3152, mem=5600),
        frac(230, cpu=4000, mem=15000, models="G2|V100M16"),
        frac(650, cpu=11908, mem=47104),
        whole(1, cpu=11300, mem=49152),
        whole(2, cpu=16200, mem=66560),
        whole(4, cpu=32200, mem=132096),
        whole(8, cpu=64200, mem=263168),
        PackRequest.mig_instance("1g.10gb", cpu_milli=2000),
        PackRequest.mig_instance("3g.40gb", cpu_milli=2000),
    ]
    weights = [30, 20, 10, 10, 15, 5, 3, 2, 3, 2]
    return rng.choices(kinds, weights=weights, k=160)


@pytest.mark.parametrize("policy", list(POLICIES))
def test_packer_decides_as_the_full_scan(policy: str) -> None:
    """The cached, incremental Packer makes exactly the decisions of scanning every node."""
    for seed in range(3):
        rng = random.Random(seed)
        ca, cb = _random_cluster(random.Random(seed)), _random_cluster(random.Random(seed))
        packer = Packer(ca, make_policy(policy))
        reference = make_policy(policy)
        for req in _random_requests(rng):
            got = packer.decide(req)
            reference.observe(req)
            want = choose(cb, reference, req)
            assert got == want, (seed, req)
            if got is not None:
                ca.allocate(got[0], req, got[1])
                cb.allocate(want[0], req, want[1])  # type: ignore[index]
        assert ca.allocated_milli == cb.allocated_milli > 0


def test_packer_follows_releases() -> None:
    c = PackingCluster([node("a", gpus=1), node("b", gpus=1)])
    packer = Packer(c, make_policy("first-fit"))
    p = packer.place(whole(1))
    assert p is not None and p.node == 0
    assert packer.place(whole(1)) is not None
    assert packer.place(whole(1)) is None
    c.release(p, whole(1))
    again = packer.place(whole(1))
    assert again is not None and again.node == 0
