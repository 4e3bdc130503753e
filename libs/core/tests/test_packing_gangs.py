"""Gangs under one leaf where they fit, all or nothing."""

from __future__ import annotations

import pytest

from ibpool_core.pool.gangs import choose_gang, place_gang
from ibpool_core.pool.packing import NodeSpec, PackingCluster, PackingError, PackRequest
from ibpool_core.pool.policies import make_policy

EIGHT = PackRequest(cpu_milli=8000, memory_mib=1000, num_gpu=8)


def fabric(sizes: dict[str, int]) -> PackingCluster:
    """Leaves with the given number of 8-GPU hosts, numbered leaf by leaf."""
    specs = []
    for leaf, n in sizes.items():
        specs += [
            NodeSpec(name=f"{leaf}-{i}", cpu_milli=96000, memory_mib=393216, gpu_model="G2", gpus=8, leaf=leaf)
            for i in range(n)
        ]
    return PackingCluster(specs)


def leaves(c: PackingCluster, nodes: list[int]) -> set[str]:
    return {c.nodes[n].leaf for n in nodes}


# (leaf sizes, hosts in the gang, nodes already busy, wanted leaves of the gang)
CASES = [
    ({"A": 4, "B": 2}, 2, [], {"B"}),  # fits both leaves: the tighter leaf, A stays whole
    ({"A": 4, "B": 2}, 3, [], {"A"}),  # only A holds 3
    ({"A": 4, "B": 2}, 2, [4], {"A"}),  # B has one free host left: A
    ({"A": 3, "B": 3, "C": 2}, 5, [], {"A", "C"}),  # no leaf holds 5: 3 from A, 2 from C; B stays whole
    ({"A": 3, "B": 1, "C": 2}, 6, [], {"A", "B", "C"}),  # needs every leaf
    ({"A": 2, "B": 1, "C": 1, "D": 3}, 4, [], {"D", "B"}),  # D, then the smallest completing leaf
]


@pytest.mark.parametrize(("sizes", "hosts", "busy", "want"), CASES)
def test_gang_leaves(sizes: dict[str, int], hosts: int, busy: list[int], want: set[str]) -> None:
    c = fabric(sizes)
    for n in busy:
        c.allocate_gpus(n, PackRequest(num_gpu=1), (0,))
    chosen = choose_gang(c, make_policy("fgd+"), EIGHT, hosts)
    assert chosen is not None and len({n for n, _ in chosen}) == hosts
    assert leaves(c, [n for n, _ in chosen]) == want


def test_gang_inside_a_leaf_takes_the_best_scored_hosts() -> None:
    c = fabric({"A": 3})
    c.allocate_gpus(1, PackRequest(num_gpu=1, gpu_milli=500), (0,))  # host 1 is partly used
    half = PackRequest(cpu_milli=1000, memory_mib=1000, num_gpu=1, gpu_milli=500)
    chosen = choose_gang(c, make_policy("best-fit"), half, 2)
    assert chosen is not None and [n for n, _ in chosen] == [1, 0]  # the fullest first, then the lowest


def test_gang_is_all_or_nothing() -> None:
    c = fabric({"A": 2, "B": 1})
    before = [c.state(n) for n in range(3)]
    assert place_gang(c, make_policy("fgd"), EIGHT, 4) is None
    assert [c.state(n) for n in range(3)] == before
    placed = place_gang(c, make_policy("fgd"), EIGHT, 3)
    assert placed is not None and sorted(p.node for p in placed) == [0, 1, 2]
    assert c.free_milli() == 0
    with pytest.raises(PackingError, match="at least one host"):
        choose_gang(c, make_policy("fgd"), EIGHT, 0)
