"""Trace files: the Philly, openb (nodes, pods) and generic CSV loaders of ibpool_sim.traces, on
arbitrary bytes and on near-misses of good files, raise only `TraceError` ("FILE:LINE: reason")."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ibpool_sim.traces import (
    TraceError,
    load_generic_jobs,
    load_openb_nodes,
    load_openb_pods,
    load_philly,
    philly_trace_jobs,
)
from tests.fuzz.budget import FUZZ, TRICKY_TOKENS, mutated, mutated_lines

LOADERS: dict[str, Callable[[Path], object]] = {
    "philly": load_philly,
    "philly-jobs": philly_trace_jobs,
    "openb-nodes": load_openb_nodes,
    "openb-pods": load_openb_pods,
    "generic": load_generic_jobs,
}
GOOD = {
    "philly": "timestamp,duration,num_gpus,gpu_time,cluster\n"
    "2017-10-03 14:07:29,3600,8,28800,vc1\n2017-10-03 15:00:00,60.5,1,60.5,vc2\n",
    "openb-nodes": "sn,cpu_milli,memory_mib,gpu,model\nnode-1,96000,786432,8,V100M32\nnode-2,64000,262144,0,\n",
    "openb-pods": "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,"
    "deletion_time,scheduled_time\npod-1,8000,30517,1,1000,,LS,Running,0,100,1\npod-2,4000,1024,0,0,,BE,Pending,5,,\n",
    "generic": "submit_s,duration_s,num_gpus,tenant,priority,time_limit_s,name\n0,100,8,a,1,200,x\n5.5,10,1,b,,,\n",
}
GOOD["philly-jobs"] = GOOD["philly"]
cells = st.sampled_from([*TRICKY_TOKENS, ",", '"', "\r", "\n", "1e400", "2017-10-03 14:07:29", "inf"]) | st.text(
    max_size=5
)


PATH = Path(tempfile.mkdtemp(prefix="ibpool-fuzz-traces-")) / "trace.csv"


def loads_or_rejects(loader: str, data: bytes) -> None:
    PATH.write_bytes(data)
    try:
        result = LOADERS[loader](PATH)
    except TraceError as e:
        assert str(e).startswith(str(PATH)), f"the error names the file: {e}"
        return
    assert isinstance(result, list)
    for item in result:  # what loads is well-typed (no missing cell, no NaN or infinite number)
        assert msgspec.json.decode(msgspec.json.encode(item), type=type(item)) == item


@pytest.mark.parametrize("loader", sorted(LOADERS))
@FUZZ
@given(data=st.binary(max_size=300))
def test_arbitrary_bytes(loader: str, data: bytes) -> None:
    loads_or_rejects(loader, data)


@pytest.mark.parametrize("loader", sorted(LOADERS))
@FUZZ
@given(data=st.data())
def test_near_misses_of_good_files(loader: str, data: st.DataObject) -> None:
    good = GOOD[loader]
    header, *rows = good.splitlines()
    loads_or_rejects(loader, data.draw(mutated_lines(good)).encode())
    loads_or_rejects(loader, data.draw(mutated(good.encode())))
    width = len(header.split(","))
    row = data.draw(st.lists(cells, min_size=width - 1, max_size=width + 1).map(",".join))
    loads_or_rejects(loader, f"{header}\n{rows[0]}\n{row}\n".encode())


def test_a_good_file_loads() -> None:
    for loader, text in GOOD.items():
        PATH.write_text(text)
        assert len(LOADERS[loader](PATH)) == 2  # type: ignore[arg-type]


@pytest.mark.parametrize("loader", sorted(LOADERS))
def test_a_cell_over_the_csv_size_limit_is_a_trace_error(loader: str) -> None:
    header, row = GOOD[loader].splitlines()[:2]
    PATH.write_text(f"{header}\n{row}\n{'x' * 200_000},{row}\n")
    with pytest.raises(TraceError, match=r":3: not CSV: field larger than field limit"):
        LOADERS[loader](PATH)
