"""Loaders for public cluster traces: Microsoft Philly and Alibaba PAI's openb (GPU sharing).

A bad row is reported with its file and line number, never silently skipped.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import math
from collections.abc import Iterator
from pathlib import Path

import msgspec


class TraceError(Exception):
    """A trace file does not have the expected shape; the message names file and line."""


class PhillyJob(msgspec.Struct, frozen=True, kw_only=True):
    submitted_at: dt.datetime
    duration_s: float
    num_gpus: int
    gpu_time_s: float
    virtual_cluster: str


class OpenbNode(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    gpu_model: str


class OpenbPod(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int
    gpu_spec: str
    qos: str
    phase: str
    created_s: int
    deleted_s: int | None
    scheduled_s: int | None


def _reader(path: Path) -> csv.DictReader[str]:
    """A CSV reader of the file's text; TraceError naming the line when it is not UTF-8."""
    data = path.read_bytes()
    try:
        text = data.decode()
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise TraceError(f"{path}:{line}: not UTF-8 text: {e.reason}") from None
    return csv.DictReader(io.StringIO(text, newline=""))


def _header(path: Path, reader: csv.DictReader[str]) -> list[str]:
    try:
        return list(reader.fieldnames or [])
    except csv.Error as e:
        raise TraceError(f"{path}:{reader.line_num + 1}: not CSV: {e}") from None  # the line being read


def _records(path: Path, reader: csv.DictReader[str]) -> Iterator[dict[str, str]]:
    """The reader's rows; TraceError naming the line for what the csv module cannot read."""
    try:
        yield from reader
    except csv.Error as e:
        raise TraceError(f"{path}:{reader.line_num + 1}: not CSV: {e}") from None  # the line being read


def _rows(path: Path, expected: list[str]) -> Iterator[tuple[int, dict[str, str]]]:
    reader = _reader(path)
    header = _header(path, reader)
    if header != expected:
        raise TraceError(f"{path}: header is {header}, expected {expected}")
    for row in _records(path, reader):
        missing = [k for k in expected if row.get(k) is None]
        if missing:
            raise TraceError(f"{path}:{reader.line_num}: the row has no {', '.join(missing)} cell")
        yield reader.line_num, row


def _float(v: str) -> float:
    value = float(v)
    if not math.isfinite(value):
        raise ValueError(f"{v!r} is not a finite number")
    return value


def _fail(path: Path, line: int, e: Exception) -> TraceError:
    return TraceError(f"{path}:{line}: {type(e).__name__}: {e}")


def load_philly(path: Path) -> list[PhillyJob]:
    jobs = []
    for line, r in _rows(path, ["timestamp", "duration", "num_gpus", "gpu_time", "cluster"]):
        try:
            jobs.append(
                PhillyJob(
                    submitted_at=dt.datetime.strptime(r["timestamp"], "%Y-%m-%d %H:%M:%S").replace(tzinfo=dt.UTC),
                    duration_s=_float(r["duration"]),
                    num_gpus=int(r["num_gpus"]),
                    gpu_time_s=_float(r["gpu_time"]),
                    virtual_cluster=r["cluster"],
                )
            )
        except (ValueError, TypeError) as e:
            raise _fail(path, line, e) from None
    return jobs


def load_openb_nodes(path: Path) -> list[OpenbNode]:
    nodes = []
    for line, r in _rows(path, ["sn", "cpu_milli", "memory_mib", "gpu", "model"]):
        try:
            nodes.append(
                OpenbNode(
                    name=r["sn"],
                    cpu_milli=int(r["cpu_milli"]),
                    memory_mib=int(r["memory_mib"]),
                    gpus=int(r["gpu"]),
                    gpu_model=r["model"],
                )
            )
        except (ValueError, TypeError) as e:
            raise _fail(path, line, e) from None
    return nodes


def _opt_int(v: str) -> int | None:
    return int(v) if v.strip() else None


def load_openb_pods(path: Path) -> list[OpenbPod]:
    header = [
        "name",
        "cpu_milli",
        "memory_mib",
        "num_gpu",
        "gpu_milli",
        "gpu_spec",
        "qos",
        "pod_phase",
        "creation_time",
        "deletion_time",
        "scheduled_time",
    ]
    pods = []
    for line, r in _rows(path, header):
        try:
            pods.append(
                OpenbPod(
                    name=r["name"],
                    cpu_milli=int(r["cpu_milli"]),
                    memory_mib=int(r["memory_mib"]),
                    num_gpu=int(r["num_gpu"]),
                    gpu_milli=int(r["gpu_milli"]),
                    gpu_spec=r["gpu_spec"],
                    qos=r["qos"],
                    phase=r["pod_phase"],
                    created_s=int(r["creation_time"]),
                    deleted_s=_opt_int(r["deletion_time"]),
                    scheduled_s=_opt_int(r["scheduled_time"]),
                )
            )
        except (ValueError, TypeError) as e:
            raise _fail(path, line, e) from None
    return pods


class TraceJob(msgspec.Struct, frozen=True, kw_only=True):
    """A job as the cluster simulator replays it: submitted `submit_s` seconds into the trace."""

    id: str
    tenant: str
    gpus: int
    submit_s: float
    duration_s: float
    priority: int = 0
    time_limit_s: float | None = None
    name: str | None = None


def philly_trace_jobs(path: Path, limit: int | None = None) -> list[TraceJob]:
    """The Philly trace in submit order, times relative to the first submission; `limit` keeps the first N."""
    rows = sorted(load_philly(path), key=lambda j: j.submitted_at)
    if limit is not None:
        rows = rows[:limit]
    if not rows:
        return []
    origin = rows[0].submitted_at
    return [
        TraceJob(
            id=f"philly-{i}",
            tenant=r.virtual_cluster,
            gpus=r.num_gpus,
            submit_s=(r.submitted_at - origin).total_seconds(),
            duration_s=r.duration_s,
        )
        for i, r in enumerate(rows)
    ]


GENERIC_HEADER = ["submit_s", "duration_s", "num_gpus", "tenant"]
GENERIC_OPTIONAL = ["priority", "time_limit_s", "name"]


def load_generic_jobs(path: Path, limit: int | None = None) -> list[TraceJob]:
    """A generic job trace: a CSV with header `submit_s,duration_s,num_gpus,tenant` and optionally
    `priority,time_limit_s,name` after them (in that order; empty cells mean unset).

    `submit_s` is seconds (any origin; times are made relative to the earliest), `duration_s` the
    runtime the job needs, `num_gpus` >= 1, `tenant` the fair-share owner. Returned in submit order.
    """
    jobs: list[TraceJob] = []
    reader = _reader(path)
    fields = _header(path, reader)
    if fields[:4] != GENERIC_HEADER or any(c not in GENERIC_OPTIONAL for c in fields[4:]):
        raise TraceError(f"{path}: header is {fields}, expected {GENERIC_HEADER} + optional {GENERIC_OPTIONAL}")
    for row in _records(path, reader):
        try:
            missing = [k for k in GENERIC_HEADER if row.get(k) is None]
            if missing:
                raise ValueError(f"the row has no {', '.join(missing)} cell")
            gpus = int(row["num_gpus"])
            if gpus < 1:
                raise ValueError(f"num_gpus must be >= 1, got {gpus}")
            jobs.append(
                TraceJob(
                    id=f"job-{reader.line_num - 1}",
                    tenant=row["tenant"],
                    gpus=gpus,
                    submit_s=_float(row["submit_s"]),
                    duration_s=_float(row["duration_s"]),
                    priority=int(row.get("priority") or 0),
                    time_limit_s=_float(row["time_limit_s"]) if row.get("time_limit_s") else None,
                    name=row.get("name") or None,
                )
            )
        except (ValueError, TypeError) as e:
            raise _fail(path, reader.line_num, e) from None
    jobs.sort(key=lambda j: j.submit_s)
    if limit is not None:
        jobs = jobs[:limit]
    origin = jobs[0].submit_s if jobs else 0.0
    return [msgspec.structs.replace(j, submit_s=j.submit_s - origin) for j in jobs]
