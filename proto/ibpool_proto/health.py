"""Health domain: verdicts of the failover controller and the actions they cause."""

from __future__ import annotations

from typing import ClassVar, Literal

from .message import Event

CordonScope = Literal["node", "gpu", "rail", "leaf"]


class NodeSuspected(Event, frozen=True, kw_only=True, tag="io.ibpool.health.node.suspected.v1"):
    key_name: ClassVar[str] = "node_id"
    summary: ClassVar[str] = "A node missed heartbeats or showed warning signs; not yet failed."

    node_id: str
    reason: str


class NodeFailed(Event, frozen=True, kw_only=True, tag="io.ibpool.health.node.failed.v1"):
    key_name: ClassVar[str] = "node_id"
    summary: ClassVar[str] = "A node is judged failed; its work must move."

    node_id: str
    reason: str


class NodeRecovered(Event, frozen=True, kw_only=True, tag="io.ibpool.health.node.recovered.v1"):
    key_name: ClassVar[str] = "node_id"
    summary: ClassVar[str] = (
        "A failed or suspected node has been healthy for the stable window, or an operator put it back (`reason`)."
    )

    node_id: str
    # Empty when the stable window put it back; who and why when an operator did.
    reason: str = ""


class GpuFailed(Event, frozen=True, kw_only=True, tag="io.ibpool.health.gpu.failed.v1"):
    key_name: ClassVar[str] = "node_id"
    summary: ClassVar[str] = "One GPU of a node is judged failed (XID, ECC, thermal); the rest keep working."

    node_id: str
    gpu_index: int
    reason: str
    xid: int | None = None


class GpuRecovered(Event, frozen=True, kw_only=True, tag="io.ibpool.health.gpu.recovered.v1"):
    key_name: ClassVar[str] = "node_id"
    summary: ClassVar[str] = (
        "An operator reset or replaced a failed GPU: its failure is cleared and it may be granted again."
    )

    node_id: str
    gpu_index: int
    # Who and why.
    reason: str


class Cordoned(Event, frozen=True, kw_only=True, tag="io.ibpool.health.cordon.applied.v1"):
    key_name: ClassVar[str] = "node_id"
    summary: ClassVar[str] = "A node, GPU, rail or leaf was taken out of scheduling."

    node_id: str
    scope: CordonScope
    reason: str
    gpu_index: int | None = None
    rail: int | None = None


class Uncordoned(Event, frozen=True, kw_only=True, tag="io.ibpool.health.cordon.lifted.v1"):
    key_name: ClassVar[str] = "node_id"
    summary: ClassVar[str] = "A cordon was lifted."

    node_id: str
    scope: CordonScope
    gpu_index: int | None = None
    rail: int | None = None
    # Empty when the signal went away; who and why when an operator lifted it.
    reason: str = ""


class DrainRequested(Event, frozen=True, kw_only=True, tag="io.ibpool.health.drain.requested.v1"):
    key_name: ClassVar[str] = "node_id"
    summary: ClassVar[str] = "The controller asked that all work move off a node before it is taken down."

    node_id: str
    reason: str


class RequeueRequested(Event, frozen=True, kw_only=True, tag="io.ibpool.health.requeue.requested.v1"):
    key_name: ClassVar[str] = "job_id"
    summary: ClassVar[str] = (
        "The controller asked that a job be requeued from its last checkpoint; its hardware failed."
    )

    job_id: str
    allocation_id: str
    reason: str
    # How many times this job's work was lost to failing hardware, this time included.
    attempt: int = 1
    # Wait at least this long before placing it again (exponential in `attempt`).
    retry_after_s: float = 0.0
    # The node whose failure (or whose GPU's) lost the work.
    node_id: str | None = None


class JobFlagged(Event, frozen=True, kw_only=True, tag="io.ibpool.health.job.flagged.v1"):
    key_name: ClassVar[str] = "job_id"
    summary: ClassVar[str] = (
        "A job kept landing on failing hardware (`failures` times); an operator should look at it or its nodes."
    )

    job_id: str
    failures: int
    reason: str
    node_ids: list[str] = []


class ClusterDegraded(Event, frozen=True, kw_only=True, tag="io.ibpool.health.cluster.degraded.v1"):
    key_name: ClassVar[str] = "cluster"
    summary: ClassVar[str] = (
        "More nodes stopped answering than may be failed at once (a partition looks like mass failure):"
        " they are held as suspected, nothing is requeued."
    )

    unreachable: int
    failed: int
    nodes: int
    max_failed: int
    node_ids: list[str] = []


class ClusterRestored(Event, frozen=True, kw_only=True, tag="io.ibpool.health.cluster.restored.v1"):
    key_name: ClassVar[str] = "cluster"
    summary: ClassVar[str] = "Unreachable nodes are back within the fraction that may fail at once; verdicts resume."

    unreachable: int
    nodes: int
