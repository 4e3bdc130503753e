"""Cells simulated: one cell is the single pool exactly, runs are deterministic, gangs larger than a
cell span cells and end together, cells are whole leaf groups; a Philly slice when the data is there."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from ibpool_sim.cells_sim import (
    CellsResult,
    cells_summary,
    leaf_groups,
    quantile,
    simulate_cells,
    split_cells,
    sub_topology,
    time_window,
)
from ibpool_sim.cluster_sim import CostModel, HostFailure, SimConfig, SimFabric, load_fabric, simulate
from ibpool_sim.sched_lineup import RunOptions, config_for, select
from ibpool_sim.shared_data import need
from ibpool_sim.traces import TraceJob, philly_trace_jobs

RAIL = "rail_optimised:hosts=32,su_size=4"  # 8 leaf groups (scalable units) of 4 hosts


def synthetic(n: int = 150) -> list[TraceJob]:
    """Mostly small jobs, gangs up to 4 hosts and, every 13th, a 96-GPU gang (12 hosts)."""
    sizes = [1, 1, 2, 4, 8, 16, 1, 24, 1, 32, 1, 2, 96]
    return [
        TraceJob(
            id=f"j{i:04d}",
            tenant=f"t{i % 3}",
            gpus=sizes[i % len(sizes)],
            submit_s=float(i * 37),
            duration_s=60.0 + (i * 7919) % 5000,
        )
        for i in range(n)
    ]


def figures(result: Any) -> dict[str, Any]:
    """A result's figures less its timings (wall and CPU seconds differ run to run)."""
    out = msgspec.to_builtins(result)
    for key in ("wall_s", "cpu_s", "router_cpu_s"):
        out.pop(key, None)
    if "whole" in out:
        for r in [out["whole"], *out["per_cell"]]:
            r.pop("wall_s"), r.pop("cpu_s")
    return out  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("policy", "options"),
    [
        ("fifo+easy", RunOptions(nodes=32)),
        ("gittins-learned", RunOptions(nodes=32)),
        ("priority", RunOptions(nodes=32, placement="framework")),
        ("las", RunOptions(nodes=32, placement="framework")),
        ("fifo+easy", RunOptions(fabric=RAIL)),
        ("gittins-learned", RunOptions(fabric=RAIL)),
        ("dynamic", RunOptions(fabric=RAIL)),
    ],
)
def test_one_cell_is_the_single_pool_exactly(policy: str, options: RunOptions) -> None:
    trace = synthetic()
    config = config_for(select(policy)[0], options)
    single = simulate(trace, config)
    cells = simulate_cells(trace, config, 1)
    assert msgspec.to_builtins(cells.whole.outcomes) == msgspec.to_builtins(single.outcomes)
    drop = ("wall_s", "cpu_s")
    assert {k: v for k, v in cells.whole.summary().items() if k not in drop} == {
        k: v for k, v in single.summary().items() if k not in drop
    }
    assert cells.spans == [] and set(cells.cell_of.values()) == {"cell0"}


def check_sane(result: CellsResult, trace: list[TraceJob]) -> None:
    by_id = {t.id: t for t in trace}
    outcomes = result.whole.outcomes
    assert sorted(o.id for o in outcomes) == sorted(by_id), "every job finishes exactly once"
    floor = 1.0 - CostModel().comm_fraction  # SHARP may shorten a gang below the trace's runtime
    for o in outcomes:
        assert o.first_start_s >= o.submit_s
        assert o.end_s - o.first_start_s >= by_id[o.id].duration_s * floor - 1e-6, o
    for s in result.spans:
        assert s.submit_s <= s.sent_s <= s.commit_s < s.end_s
        assert sum(s.parts.values()) == s.hosts and len(s.parts) >= 2
    ends: dict[str, set[float]] = {}
    for cell in result.per_cell:
        for o in cell.outcomes:
            if "@" in o.id:
                ends.setdefault(o.id.split("@")[0], set()).add(o.end_s)
    assert all(len(e) == 1 for e in ends.values()), "a gang's parts end together"
    assert set(ends) == {s.id for s in result.spans}
    assert 0.0 < float(result.whole.summary()["utilisation"]) <= 1.0


@pytest.mark.parametrize("policy", ["fifo+easy", "gittins-learned", "priority"])
@pytest.mark.parametrize("options", [RunOptions(nodes=32), RunOptions(fabric=RAIL)], ids=["leaf", "rail"])
def test_gangs_larger_than_a_cell_span_cells_and_every_job_ends(policy: str, options: RunOptions) -> None:
    trace = synthetic()
    config = config_for(select(policy)[0], options)
    big = sorted(t.id for t in trace if t.gpus == 96)
    two = simulate_cells(trace, config, 2)  # cells of 16 hosts: the 12-host gangs fit
    check_sane(two, trace)
    assert two.spans == []
    four = simulate_cells(trace, config, 4)  # cells of 8 hosts: they span two cells
    check_sane(four, trace)
    assert [s.id for s in four.spans] == big
    assert all(four.cell_of[j] == "span" for j in big)
    row = cells_summary(four)
    assert row["spanned"] == len(big) and row["jobs"] == len(trace)
    assert int(row["routed_fits"]) + int(row["routed_waits"]) + int(row["spanned"]) == len(trace)


def test_runs_are_deterministic() -> None:
    trace = synthetic()
    config = config_for(select("gittins-learned")[0], RunOptions(fabric=RAIL))
    first = figures(simulate_cells(trace, config, 4))
    assert figures(simulate_cells(trace, config, 4)) == first
    assert msgspec.json.encode(first) == msgspec.json.encode(figures(simulate_cells(trace, config, 4)))


def test_cells_are_whole_leaf_groups() -> None:
    names, groups, topology = leaf_groups(SimConfig(fabric=RAIL))
    assert topology is not None and len(groups) == 8 and all(len(g) == 4 for g in groups)
    cells = split_cells(groups, 4)
    assert [len(c.hosts) for c in cells] == [8, 8, 8, 8]
    assert [h for c in cells for h in c.hosts] == names
    uneven = split_cells(groups, 3)
    assert [len(c.hosts) for c in uneven] == [12, 12, 8]
    with pytest.raises(ValueError, match=r"1\.\.8 cells"):
        split_cells(groups, 9)
    sub = SimFabric(sub_topology(topology, cells[1].hosts), SimConfig())
    assert sub.names == cells[1].hosts and sub.hosts_per_leaf == 4
    assert len({sub.leaf_of[h] for h in range(len(sub.names))}) == 2
    assert SimFabric(load_fabric(RAIL), SimConfig()).names == names


def test_abstract_cluster_cells_and_what_is_refused() -> None:
    _, groups, topology = leaf_groups(SimConfig(nodes=20, hosts_per_leaf=8))
    assert topology is None and [len(g) for g in groups] == [8, 8, 4]
    trace = synthetic(20)
    with pytest.raises(ValueError, match="host failures"):
        simulate_cells(trace, SimConfig(nodes=32, failures=[HostFailure(host=0, at_s=1.0, down_s=1.0)]), 2)
    with pytest.raises(ValueError, match="more hosts than the cluster"):
        simulate_cells(trace, SimConfig(nodes=8), 1)


def test_quantiles_and_windows() -> None:
    assert quantile([], 0.5) == 0.0
    assert quantile([3.0, 1.0, 2.0, 4.0], 0.5) == 2.0
    assert quantile([float(i) for i in range(100)], 0.99) == 98.0
    window = time_window(synthetic(10), 100.0, 200.0)
    assert [(t.id, t.submit_s) for t in window] == [("j0003", 0.0), ("j0004", 37.0), ("j0005", 74.0)]
    assert time_window(synthetic(10), 1e9, 2e9) == []


def test_a_philly_slice_on_the_rail_fabric() -> None:
    """Days 98-101 of Philly (624 jobs, two 128-GPU gangs) on the 64-host rail fabric: one cell is the
    single pool; with 8 cells of 8 hosts the 128-GPU gangs span two cells. Skips without the shared
    data unless IBPOOL_REQUIRE_SHARED_DATA=1."""
    trace = time_window(philly_trace_jobs(need("traces/philly/philly.csv")), 98 * 86_400.0, 101 * 86_400.0)
    assert len(trace) == 624
    config = config_for(select("fifo+easy")[0], RunOptions(fabric="rail_optimised:hosts=64,su_size=8"))
    one = simulate_cells(trace, config, 1)
    assert msgspec.to_builtins(one.whole.outcomes) == msgspec.to_builtins(simulate(trace, config).outcomes)
    eight = simulate_cells(trace, config, 8)
    check_sane(eight, trace)
    assert sorted(s.id for s in eight.spans) == sorted(t.id for t in trace if t.gpus > 64)
    assert all(len(s.parts) == 2 for s in eight.spans)
