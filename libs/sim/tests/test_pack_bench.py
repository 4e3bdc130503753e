"""`ibpool bench pack` (ibpool_sim.pack_bench): streams, runs, figures, and the real openb traces."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from ibpool_core.pool.packing import WHOLE, PackingCluster, PackRequest, fit_options
from ibpool_sim import pack_bench
from ibpool_sim.shared_data import need
from ibpool_sim.traces import TraceError

OPENB = "traces/alibaba-openb"
FULL_HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time"
)


def write_cluster(tmp: Path, nodes: int = 50, pods: int = 60, seed: int = 1) -> tuple[Path, Path]:
    """A small synthetic cluster and pod list in the openb CSV formats."""
    rng = random.Random(seed)
    shapes = [(96000, 393216, 8, "G2"), (104000, 524288, 2, "T4"), (16000, 122880, 2, "P100")]
    node_rows = ["sn,cpu_milli,memory_mib,gpu,model"]
    for i in range(nodes):
        cpu, mem, g, model = rng.choice(shapes)
        node_rows.append(f"node-{i:03d},{cpu},{mem},{g},{model}")
    pod_rows = [FULL_HEADER]
    for i in range(pods):
        kind = rng.random()
        if kind < 0.6:
            num, milli = 1, rng.choice([230, 320, 470, 650, 810])
        elif kind < 0.9:
            num, milli = 1, WHOLE
        else:
            num, milli = rng.choice([2, 4, 8]), WHOLE
        spec = "T4|G2" if rng.random() < 0.1 else ""
        cpu = rng.choice([3152, 4000, 8000, 11908]) * num
        pod_rows.append(f"pod-{i},{cpu},{cpu * 4},{num},{milli},{spec},LS,Running,0,,0")
    pod_rows.append("cpu-only,4000,8000,0,0,,BE,Running,0,,0")
    n, p = tmp / "nodes.csv", tmp / "openb_pod_list_tiny.csv"
    n.write_text("\n".join(node_rows) + "\n")
    p.write_text("\n".join(pod_rows) + "\n")
    return n, p


def test_arrival_stream_is_seeded_and_stops_at_130_percent() -> None:
    pods = [PackRequest(num_gpu=1, gpu_milli=m) for m in (250, 500, 1000)] + [PackRequest(num_gpu=2)]
    cap = 20 * WHOLE
    a, b = pack_bench.arrival_stream(pods, cap, 3), pack_bench.arrival_stream(pods, cap, 3)
    assert a == b and a != pack_bench.arrival_stream(pods, cap, 4)
    demand = [pods[i].gpu_demand_milli for i in a]
    assert sum(demand) >= 1.3 * cap > sum(demand[:-1])  # the crossing arrival is the last
    assert pack_bench.arrival_stream([], cap, 0) == []


def test_pod_lists_with_both_headers(tmp_path: Path) -> None:
    full = tmp_path / "full.csv"
    full.write_text(FULL_HEADER + "\np1,8000,16384,1,470,V100M16|V100M32,LS,Running,0,,0\np2,2000,4096,0,0,,BE,x,0,,\n")
    short = tmp_path / "short.csv"
    short.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np1,88000,327680,8,1000\n")
    rows = pack_bench.load_pods(full)
    assert rows[0].request == PackRequest(
        cpu_milli=8000, memory_mib=16384, num_gpu=1, gpu_milli=470, gpu_models=frozenset({"V100M16", "V100M32"})
    )
    assert rows[1].request.num_gpu == 0
    assert pack_bench.load_pods(short)[0].request == PackRequest(cpu_milli=88000, memory_mib=327680, num_gpu=8)
    bad = tmp_path / "bad.csv"
    bad.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np1,1,1,1,500\np2,1,1,2,500\n")
    with pytest.raises(TraceError, match=r"bad.csv:3: PackingError"):
        pack_bench.load_pods(bad)
    wrong = tmp_path / "wrong.csv"
    wrong.write_text("name,cpus\n")
    with pytest.raises(TraceError, match="header"):
        pack_bench.load_pods(wrong)


def test_small_bench_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes, pods = write_cluster(tmp_path)
    out, png = tmp_path / "pack.json", tmp_path / "pack.png"
    argv = ["--pods", str(pods), "--nodes", str(nodes), "--seeds", "1", "--format", "json", "--jobs", "1"]
    assert pack_bench.main([*argv, "--out", str(out), "--plot", str(png)]) == 0
    printed = json.loads(capsys.readouterr().out)
    full = json.loads(out.read_text())
    assert len(printed["runs"]) == len(full["runs"]) == len(pack_bench.DEFAULT_POLICIES)
    for r in full["runs"]:
        assert r["pods"] == "tiny" and r["seed"] == 0
        assert 0 <= r["unallocated_at_100"] <= 1 and r["arrivals_at_100"] <= r["arrivals"]
        assert r["rejected_end"] >= r["rejected_at_100"] >= 0
        xs = [x for x, _ in r["curve"]]
        assert xs == sorted(xs) and xs[-1] >= 1.3 and all(0 <= y <= 1 for _, y in r["curve"])
    streams = {r["arrivals"] for r in full["runs"]}
    assert len(streams) == 1, "every policy runs on the same stream"
    floors = full["summary"]["floors"]
    assert set(floors) == {"fgd", "fgd+"} and len(floors["fgd"]["per_seed"]) == 1
    assert png.stat().st_size > 10_000 and png.read_bytes()[:4] == b"\x89PNG"
    # the table format, and the same figures with two processes
    assert pack_bench.main([*argv[:-4], "--policy", "best-fit,fgd", "--format", "table", "--jobs", "2"]) == 0
    table = capsys.readouterr().out
    assert "| tiny | fgd |" in table and "fgd vs best-fit" in table


def test_bad_arguments_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes, pods = write_cluster(tmp_path, nodes=3, pods=3)
    assert pack_bench.main(["--pods", str(pods), "--nodes", str(nodes), "--policy", "best-fit,nope"]) == 2
    assert "unknown policy nope" in capsys.readouterr().err
    assert pack_bench.main(["--pods", str(tmp_path / "missing.csv"), "--nodes", str(nodes)]) == 2
    assert "no such file" in capsys.readouterr().err


@pytest.mark.shared_data
def test_openb_traces_load_and_run() -> None:
    """The real Alibaba PAI openb data: sizes as SOURCES.md states, and a short run on part of it."""
    nodes = pack_bench.load_nodes(need(f"{OPENB}/openb_node_list_gpu_node.csv"))
    assert len(nodes) == 1_213 and sum(n.gpus for n in nodes) == 6_212
    gpu_pods = {}
    for name in pack_bench.DEFAULT_PODS:
        rows = pack_bench.load_pods(need(f"{OPENB}/{name}"))
        gpu_pods[name] = [r.request for r in rows if r.request.num_gpu > 0]
    assert {k: len(v) for k, v in gpu_pods.items()} == {
        "openb_pod_list_default.csv": 7_064,
        "openb_pod_list_gpushare100.csv": 7_064,
        "openb_pod_list_multigpu50.csv": 7_973,
    }
    assert all(0 < p.gpu_milli < WHOLE for p in gpu_pods["openb_pod_list_gpushare100.csv"])
    assert sum(p.num_gpu == 8 for p in gpu_pods["openb_pod_list_multigpu50.csv"]) == 556
    empty = PackingCluster(nodes)
    kinds = {p for v in gpu_pods.values() for p in v}
    assert all(any(fit_options(empty, st, k) for st in empty.groups) for k in kinds), "a pod no node can hold"
    part = nodes[::8]  # 152 nodes of every model
    pods = gpu_pods["openb_pod_list_default.csv"]
    cap = WHOLE * sum(n.gpus for n in part)
    stream = pack_bench.arrival_stream(pods, cap, 0)
    runs = {p: pack_bench.run_one(part, pods, stream, p, label="default", seed=0) for p in ("best-fit", "fgd", "fgd+")}
    for r in runs.values():
        assert 0 < r.unallocated_at_100 < 0.5 and r.arrivals == len(stream)
