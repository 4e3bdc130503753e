"""The FGD fragmentation measure, its fast model, the fgd+ extensions and the learned workload mix."""

from __future__ import annotations

import random

import pytest

from ibpool_core.pool.fragmentation import FragModel, WorkloadMix, fragment
from ibpool_core.pool.mig import MigInstance
from ibpool_core.pool.packing import WHOLE, NodeSpec, PackingCluster, PackRequest

H100 = "NVIDIA H100 80GB HBM3"


def frac(milli: int, cpu: int = 0, mem: int = 0) -> PackRequest:
    return PackRequest(cpu_milli=cpu, memory_mib=mem, num_gpu=1, gpu_milli=milli)


def whole(n: int, cpu: int = 0, mem: int = 0) -> PackRequest:
    return PackRequest(cpu_milli=cpu, memory_mib=mem, num_gpu=n)


def one_node(gpus_free: list[int], cpu_free: int, mem_free: int = 10**6, model: str = "1080") -> PackingCluster:
    """A node whose GPUs have `gpus_free` milli free and whose host has `cpu_free` CPU free."""
    cap_cpu = cpu_free + 1000
    c = PackingCluster(
        [NodeSpec(name="n", cpu_milli=cap_cpu, memory_mib=mem_free + 1000, gpu_model=model, gpus=len(gpus_free))]
    )
    c.allocate_gpus(0, PackRequest(cpu_milli=1000, memory_mib=1000), ())
    for g, f in enumerate(gpus_free):
        if f < WHOLE:
            c.allocate_gpus(0, PackRequest(num_gpu=1, gpu_milli=WHOLE - f) if f else whole(1), (g,))
    return c


# Hand-worked examples of the paper's definition (Weng et al., ATC'23, section 3): a node with
# GPUs free [200, 1000, 1000, 500] milli.
PAPER_CASES = [
    # task                       cpu free  fragment   why
    (frac(465, cpu=6000), 64000, 200, "fits: only the 200-milli GPU is too small for 465"),
    (frac(150, cpu=6000), 64000, 0, "fits: every GPU has 150 free"),
    (frac(600, cpu=6000), 64000, 700, "fits: the 200 and 500 GPUs are fragments"),
    (whole(1, cpu=4000), 64000, 700, "fits: the partly used GPUs are fragments for whole GPUs"),
    (whole(2, cpu=4000), 64000, 700, "fits on the two whole GPUs"),
    (whole(3, cpu=4000), 64000, 2700, "cannot run (only 2 whole GPUs): all 2700 free milli"),
    (frac(465, cpu=6000), 1000, 2700, "cannot run (CPU short, Q-IV): all free GPU"),
    (PackRequest(cpu_milli=1000), 64000, 2700, "asks no GPU (x-axis): all free GPU"),
]


@pytest.mark.parametrize(("task", "cpu_free", "want", "why"), PAPER_CASES)
def test_fragment_of_one_task(task: PackRequest, cpu_free: int, want: int, why: str) -> None:
    assert fragment([200, 1000, 1000, 500], cpu_free, task) == want, why
    # the fast model, with the task as the whole mix, says the same
    c = one_node([200, 1000, 1000, 500], cpu_free)
    assert FragModel(c, [(task, 1)]).frag(c.state(0)) == want, why


def test_expected_fragmentation_is_the_popularity_weighted_sum() -> None:
    # the same node and a mix of three task types with counts 5, 3, 2 (popularity 0.5, 0.3, 0.2):
    # F = 0.5 * 200 + 0.3 * 700 + 0.2 * 2700 = 100 + 210 + 540 = 850 milli
    mix = [(frac(465, cpu=6000), 5), (whole(1, cpu=4000), 3), (whole(3, cpu=4000), 2)]
    c = one_node([200, 1000, 1000, 500], 64000)
    m = FragModel(c, mix)
    assert m.frag(c.state(0)) == 850 * 10  # F x W, W = 10
    assert m.node_fraction(c.state(0)) == pytest.approx(0.85)
    assert m.cluster_fraction() == pytest.approx(0.85)


def test_simulator_q4_example() -> None:
    # the FGD authors' simulator test: GPUs [200, 1000, 1000, 500], 1000 CPU left, one task type
    # (6000 CPU, 465 milli) at 9.33%: lacking CPU, all 2700 milli are fragments -> 251.91
    c = one_node([200, 1000, 1000, 500], 1000)
    m = FragModel(c, [(frac(465, cpu=6000), 933)])
    assert m.frag(c.state(0)) / 10_000 == pytest.approx(251.91)


def test_fast_model_matches_the_definition_on_random_nodes() -> None:
    rng = random.Random(7)
    kinds = [frac(m, cpu=c) for m in (50, 230, 470, 810) for c in (1000, 8000)]
    kinds += [whole(n, cpu=c) for n in (1, 2, 4, 8) for c in (4000, 32000)]
    for _ in range(200):
        gpus = [rng.choice([0, 50, 190, 300, 530, 1000, 1000]) for _ in range(rng.choice([1, 2, 4, 8]))]
        cpu = rng.choice([0, 3000, 9000, 40000])
        mix = [(k, rng.randint(1, 9)) for k in rng.sample(kinds, 6)]
        c = one_node(gpus, cpu)
        want = sum(w * fragment(gpus, cpu, k) for k, w in mix)
        assert FragModel(c, mix).frag(c.state(0)) == want, (gpus, cpu, mix)


def _host_capped(gpus: list[int], cpu: int, task: PackRequest) -> int:
    """The host-capped fragment, straight from its definition (plain GPUs, CPU only)."""
    paper = fragment(gpus, cpu, task)
    if task.gpu_milli >= WHOLE or paper == sum(gpus) or not task.cpu_milli:
        return paper
    usable = sum(gpus) - paper
    return sum(gpus) - min(usable, cpu // task.cpu_milli * task.gpu_milli)


def test_host_weighted_model_matches_its_definition_on_random_nodes() -> None:
    rng = random.Random(11)
    kinds = [frac(m, cpu=c) for m in (50, 230, 470, 810) for c in (1000, 8000, 12000)]
    kinds += [whole(n, cpu=c) for n in (1, 2, 8) for c in (4000, 32000)]
    for _ in range(200):
        gpus = [rng.choice([0, 50, 190, 300, 530, 1000, 1000]) for _ in range(rng.choice([1, 2, 4, 8]))]
        cpu = rng.choice([0, 3000, 9000, 20000, 40000])
        mix = [(k, rng.randint(1, 9)) for k in rng.sample(kinds, 6)]
        c = one_node(gpus, cpu)
        host = sum(w * _host_capped(gpus, cpu, k) for k, w in mix)
        paper = sum(w * fragment(gpus, cpu, k) for k, w in mix)
        assert FragModel(c, mix, host_weight=1.0).frag(c.state(0)) == host
        assert FragModel(c, mix, host_weight=0.5).frag(c.state(0)) == host + paper
        assert FragModel(c, mix, host_weight=0.25).frag(c.state(0)) == host + 3 * paper


def test_memory_aware_sees_host_memory() -> None:
    c = one_node([1000, 1000], 64000, mem_free=8000)
    task = frac(500, cpu=1000, mem=16000)
    assert FragModel(c, [(task, 1)]).frag(c.state(0)) == 0  # the paper's rule: memory not looked at
    assert FragModel(c, [(task, 1)], memory_aware=True).frag(c.state(0)) == 2000


def test_host_weight_counts_gpu_stranded_by_cpu() -> None:
    # 8 free GPUs but CPU for only 2 tasks of (4000 CPU, 500 milli): they can use 1000 milli,
    # so 7000 are stranded; whole-GPU types keep the paper's rule
    c = one_node([WHOLE] * 8, 10000)
    task = frac(500, cpu=4000)
    assert FragModel(c, [(task, 1)]).frag(c.state(0)) == 0
    assert FragModel(c, [(task, 1)], host_weight=1.0).frag(c.state(0)) == 7000
    half = FragModel(c, [(task, 1)], host_weight=0.5)  # fgd+: half of each, kept x 2 in integers
    assert half.frag(c.state(0)) == 7000 and half.node_fraction(c.state(0)) == pytest.approx(3.5)
    assert FragModel(c, [(whole(1, cpu=4000), 1)], host_weight=1.0).frag(c.state(0)) == 0
    # a type that does not fit at all is all fragment either way
    assert FragModel(c, [(frac(500, cpu=20000), 1)], host_weight=0.5).frag(c.state(0)) == 2 * 8000
    # memory caps it too when memory-aware: memory for one task -> 7500 stranded
    c = one_node([WHOLE] * 8, 10000, mem_free=20000)
    task = frac(500, cpu=4000, mem=15000)
    assert FragModel(c, [(task, 1)], host_weight=1.0, memory_aware=True).frag(c.state(0)) == 7500
    with pytest.raises(ValueError, match="host_weight"):
        FragModel(c, [], host_weight=2.0)


def test_mig_aware_counts_the_instances_that_still_fit() -> None:
    c = PackingCluster(
        [NodeSpec(name="h", cpu_milli=64000, memory_mib=10**6, gpu_model=H100, gpus=2, gpu_memory_mib=81559)],
        mig_layouts={(0, 0): [MigInstance(profile="4g.40gb", start=0)]},
    )
    st = c.state(0)  # GPU 0: 4g@0, 429 milli free; GPU 1: whole and free
    one_g, three_g = PackRequest.mig_instance("1g.10gb"), PackRequest.mig_instance("3g.40gb")
    # 1g: 3 more on GPU 0 (426 milli), 7 on the free GPU (994): F = 1429 - 1420 = 9
    assert FragModel(c, [(one_g, 1)], mig_aware=True).frag(st) == 9
    # 3g: 1 more on GPU 0 (428), 2 on the free GPU (856): F = 1429 - 1284 = 145
    assert FragModel(c, [(three_g, 1)], mig_aware=True).frag(st) == 145
    c.allocate_gpus(0, PackRequest.mig_instance("1g.10gb"), (0,), 4)  # 1g@4 blocks the 3g at 4
    assert FragModel(c, [(three_g, 1)], mig_aware=True).frag(c.state(0)) == 1287 - 856
    # not MIG-aware: a MIG type is a plain 428-milli fraction, which a partitioned GPU cannot take
    assert FragModel(c, [(three_g, 1)]).frag(c.state(0)) == 287


def test_workload_mix_learns_the_recent_requests() -> None:
    mix = WorkloadMix(window=4, refresh=3)
    a, b = frac(100), frac(200)
    versions = []
    for r in [a, a, b, b, b, b, b, b, b, b]:
        mix.observe(r)
        versions.append(mix.version)
    # snapshots at arrivals 1, 2, 4, then every 3: 7, 10
    assert versions == [1, 2, 2, 3, 3, 3, 4, 4, 4, 5]
    assert mix.types() == ((b, 4),)  # the window forgot the a's
    fixed = WorkloadMix.fixed([(a, 2), (b, 0)])
    fixed.observe(b)
    assert fixed.types() == ((a, 2),) and fixed.version == 1
    with pytest.raises(ValueError, match="window"):
        WorkloadMix(window=0)
