"""The trace loaders on the real shared traces (skipped only when the data is absent and not required)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ibpool_sim.shared_data import need
from ibpool_sim.traces import TraceError, load_openb_nodes, load_openb_pods, load_philly


def test_philly_trace_loads_every_job() -> None:
    jobs = load_philly(need("traces/philly/philly.csv"))
    assert len(jobs) == 82_247  # as SOURCES.md states
    assert all(j.num_gpus >= 0 and j.duration_s >= 0 for j in jobs)
    assert min(j.submitted_at for j in jobs).year == 2017
    assert len({j.virtual_cluster for j in jobs}) > 5


def test_openb_nodes_and_pods_load() -> None:
    nodes = load_openb_nodes(need("traces/alibaba-openb/openb_node_list_gpu_node.csv"))
    assert len(nodes) == 1_213 and sum(n.gpus for n in nodes) == 6_212  # as SOURCES.md states
    pods = load_openb_pods(need("traces/alibaba-openb/openb_pod_list_default.csv"))
    assert len(pods) == 8_152
    assert any(0 < p.gpu_milli < 1000 for p in pods), "the default trace has fractional GPU requests"


def test_bad_row_names_file_and_line(tmp_path: Path) -> None:
    f = tmp_path / "philly.csv"
    f.write_text(
        "timestamp,duration,num_gpus,gpu_time,cluster\n2017-10-09 07:01:55,66.0,1,66.0,a\n"
        "2017-10-09 07:01:55,sixty,1,66.0,a\n"
    )
    with pytest.raises(TraceError, match=r"philly.csv:3: ValueError"):
        load_philly(f)


def test_wrong_header_is_reported(tmp_path: Path) -> None:
    f = tmp_path / "nodes.csv"
    f.write_text("name,cpus\nx,1\n")
    with pytest.raises(TraceError, match="header"):
        load_openb_nodes(f)
