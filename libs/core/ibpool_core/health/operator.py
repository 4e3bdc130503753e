"""What an operator may tell the failover controller, as a pure rule: `act(OperatorRequest) -> OperatorReply`.

Five actions, each idempotent (a second one finds "nothing to do" and publishes nothing):

- `RecoverGpu`: the GPU was reset or replaced. A failed or cordoned GPU is cleared: GpuRecovered
  (who and why) when it had failed, Uncordoned gpu when it was cordoned. A signal that is still there
  (retired pages at their limit, a GPU still hot) judges it again on its next sample.
- `RecoverNode`: put a failed, suspected, held (flapping) or operator-drained node back at once:
  NodeRecovered when it was suspected or failed, Uncordoned node when it was cordoned. It gets a fresh
  heartbeat window from now: a node that does not beat is failed again after `fail_after_s`. Its
  failure count is kept, so a node that fails again is held longer. GPU verdicts and rail/leaf
  cordons (the fabric monitor's) are left alone.
- `DrainNode`: Cordoned node, DrainRequested and RequeueRequested for the work there, as for a failed
  node, without blaming the jobs (no hardware hit is counted, no backoff). The drain holds until an
  operator recovers the node, whatever the verdicts do meanwhile.
- `CordonNode`: no new work on the node (or, with `gpu_index`, on that GPU); the work there stays
  (Cordoned, no DrainRequested). Like a drain it outlives every verdict (a failure and its automatic
  recovery, a GPU's samples, a re-registration) until an operator lifts it.
- `UncordonNode`: lifts an operator's cordon (Uncordoned). A cordon something else still asks for
  (a failed node or GPU, a drain) stays, and the detail says which; recovering clears those.

An action on a node the controller does not know is `not_found`; a GPU index the node did not
register is `not_found` too. The reason (who and why) goes into every event that has a reason.
Pure: no I/O, no wall clock, no randomness. The action has no id of its own: the events' ids derive
from the action itself (`operator/<action as JSON>`, with each event's key and position, as in
`decide`), so the same action at the same time gives the same events, ids included.
"""

from __future__ import annotations

import datetime as dt
from typing import Literal

import msgspec

from ibpool_proto.health import DrainRequested, GpuRecovered, NodeRecovered, RequeueRequested, Uncordoned
from ibpool_proto.message import Event

from .decide import FailoverConfig, FailoverRequest, GpuHealth, HealthState, StateChanges, _Decision

Outcome = Literal["done", "nothing_to_do", "not_found"]


class RecoverGpu(msgspec.Struct, frozen=True, kw_only=True, tag="recover_gpu"):
    node_id: str
    gpu_index: int
    reason: str


class RecoverNode(msgspec.Struct, frozen=True, kw_only=True, tag="recover_node"):
    node_id: str
    reason: str


class DrainNode(msgspec.Struct, frozen=True, kw_only=True, tag="drain_node"):
    node_id: str
    reason: str


class CordonNode(msgspec.Struct, frozen=True, kw_only=True, tag="cordon_node"):
    node_id: str
    reason: str
    # One GPU of the node (None: the whole node).
    gpu_index: int | None = None


class UncordonNode(msgspec.Struct, frozen=True, kw_only=True, tag="uncordon_node"):
    node_id: str
    reason: str
    gpu_index: int | None = None


OperatorAction = RecoverGpu | RecoverNode | DrainNode | CordonNode | UncordonNode


class OperatorRequest(msgspec.Struct, frozen=True, kw_only=True):
    state: HealthState
    now: dt.datetime
    action: OperatorAction
    config: FailoverConfig = msgspec.field(default_factory=FailoverConfig)


class OperatorReply(msgspec.Struct, frozen=True, kw_only=True):
    state: HealthState
    outcome: Outcome
    # What was done, or why nothing was.
    detail: str
    events: list[Event] = []
    changes: StateChanges = msgspec.field(default_factory=StateChanges)


def act(request: OperatorRequest) -> OperatorReply:
    """Apply one operator action to the health picture. See the module docstring."""
    d = _Decision(FailoverRequest(state=request.state, now=request.now, config=request.config))
    a = request.action
    d.cause = f"operator/{msgspec.json.encode(a).decode()}"
    n = d.nodes.get(a.node_id)
    if n is None:
        return OperatorReply(
            state=request.state,
            outcome="not_found",
            detail=f"no node {a.node_id!r} is known to the failover controller",
        )
    match a:
        case RecoverGpu():
            outcome, detail = _recover_gpu(d, a)
        case RecoverNode():
            outcome, detail = _recover_node(d, a)
        case DrainNode():
            outcome, detail = _drain_node(d, a)
        case CordonNode() | UncordonNode() if a.gpu_index is not None and (missing := _no_such_gpu(d, a)):
            outcome, detail = "not_found", missing
        case CordonNode():
            outcome, detail = _cordon(d, a)
        case UncordonNode():
            outcome, detail = _uncordon(d, a)
    if outcome != "done":
        return OperatorReply(state=request.state, outcome=outcome, detail=detail)
    return OperatorReply(state=d.state(), outcome=outcome, detail=detail, events=d.events, changes=d.changes())


def _no_such_gpu(d: _Decision, a: RecoverGpu | CordonNode | UncordonNode) -> str:
    """Why the action's GPU index is not one the node registered ("" when it is)."""
    n = d.nodes[a.node_id]
    index = a.gpu_index
    if index is not None and (index < 0 or (n.gpu_count is not None and index >= n.gpu_count)):
        have = "no GPUs" if not n.gpu_count else f"GPUs 0..{n.gpu_count - 1}"
        return f"node {a.node_id} has no GPU {index} (it registered {have})"
    return ""


def _recover_gpu(d: _Decision, a: RecoverGpu) -> tuple[Outcome, str]:
    n = d.nodes[a.node_id]
    if missing := _no_such_gpu(d, a):
        return "not_found", missing
    g = n.gpus.get(a.gpu_index)
    if g is None or not (g.failed or g.cordoned):
        return "nothing_to_do", f"GPU {a.gpu_index} of node {a.node_id} is neither failed nor cordoned"
    if g.failed:
        d.emit(GpuRecovered(**d.env(n.node_id), node_id=n.node_id, gpu_index=g.index, reason=a.reason))
    if g.cordoned:
        d.emit(Uncordoned(**d.env(n.node_id), node_id=n.node_id, scope="gpu", gpu_index=g.index, reason=a.reason))
    gpus = {i: x for i, x in n.gpus.items() if i != g.index}
    d.put(msgspec.structs.replace(n, gpus=gpus))
    was = "failed" if g.failed else "cordoned"
    return "done", f"GPU {g.index} of node {n.node_id} was {was} ({g.reason}); cleared"


def _recover_node(d: _Decision, a: RecoverNode) -> tuple[Outcome, str]:
    n = d.nodes[a.node_id]
    if n.status == "healthy" and not n.cordoned and not n.operator_drain:
        return "nothing_to_do", f"node {n.node_id} is healthy and not cordoned"
    if n.status != "healthy":
        d.emit(NodeRecovered(**d.env(n.node_id), node_id=n.node_id, reason=a.reason))
    if n.cordoned:
        d.emit(Uncordoned(**d.env(n.node_id), node_id=n.node_id, scope="node", reason=a.reason))
    was = n.status if n.status != "healthy" else "drained" if n.operator_drain else "cordoned"
    why = n.reason or n.operator_drain
    d.put(
        msgspec.structs.replace(
            n,
            status="healthy",
            reason="",
            since=d.now,
            healthy_since=None,
            needs_reboot=False,
            cordoned=False,
            operator_drain="",
            operator_cordon="",
            # A fresh heartbeat window: silence from now on fails it again.
            last_beat=d.now if n.last_beat is not None else None,
        )
    )
    return "done", f"node {n.node_id} was {was}{f' ({why})' if why else ''}; put back"


def _drain_node(d: _Decision, a: DrainNode) -> tuple[Outcome, str]:
    n = d.nodes[a.node_id]
    if n.operator_drain:
        return "nothing_to_do", f"node {n.node_id} is already drained: {n.operator_drain}"
    if not n.cordoned:
        d.emit(d.cordoned(n.node_id, "node", a.reason))
    d.emit(DrainRequested(**d.env(n.node_id), node_id=n.node_id, reason=a.reason))
    seen: set[str] = set()
    for h in d.on_node(n.node_id):
        job = d.jobs.get(h.job_id)
        if h.allocation_id in seen or (job is not None and h.allocation_id in job.counted):
            continue  # a gang member on another node, or work a failure already requeued
        seen.add(h.allocation_id)
        d.emit(
            RequeueRequested(
                **d.env(h.job_id),
                job_id=h.job_id,
                allocation_id=h.allocation_id,
                reason=f"node {n.node_id} drained: {a.reason}",
                node_id=n.node_id,
            )
        )
    d.put(msgspec.structs.replace(n, cordoned=True, operator_drain=a.reason))
    jobs = f"; {len(seen)} allocation(s) requeued" if seen else ""
    return "done", f"node {n.node_id} cordoned and drained{jobs}"


def _cordon(d: _Decision, a: CordonNode) -> tuple[Outcome, str]:
    n = d.nodes[a.node_id]
    if a.gpu_index is not None:
        g = n.gpus.get(a.gpu_index) or GpuHealth(index=a.gpu_index)
        if g.operator_cordon:
            return "nothing_to_do", f"GPU {g.index} of node {n.node_id} is already cordoned: {g.operator_cordon}"
        if not g.cordoned:
            d.emit(d.cordoned(n.node_id, "gpu", a.reason, gpu_index=g.index))
        g = msgspec.structs.replace(g, cordoned=True, operator_cordon=a.reason, fine_since=None)
        d.put(msgspec.structs.replace(n, gpus={**n.gpus, g.index: g}))
        return "done", f"GPU {g.index} of node {n.node_id} cordoned; its work stays"
    if n.operator_cordon:
        return "nothing_to_do", f"node {n.node_id} is already cordoned: {n.operator_cordon}"
    if not n.cordoned:
        d.emit(d.cordoned(n.node_id, "node", a.reason))
    d.put(msgspec.structs.replace(n, cordoned=True, operator_cordon=a.reason))
    return "done", f"node {n.node_id} cordoned; its work stays"


def _uncordon(d: _Decision, a: UncordonNode) -> tuple[Outcome, str]:
    n = d.nodes[a.node_id]
    if a.gpu_index is not None:
        g = n.gpus.get(a.gpu_index)
        if g is None or not g.operator_cordon:
            return "nothing_to_do", f"GPU {a.gpu_index} of node {n.node_id} is not cordoned by an operator"
        gpus = dict(n.gpus)
        if g.failed:  # its failure keeps it cordoned
            gpus[g.index] = msgspec.structs.replace(g, operator_cordon="")
            d.put(msgspec.structs.replace(n, gpus=gpus))
            return "done", f"GPU {g.index} of node {n.node_id}: operator's cordon lifted; still cordoned: {g.reason}"
        d.emit(Uncordoned(**d.env(n.node_id), node_id=n.node_id, scope="gpu", gpu_index=g.index, reason=a.reason))
        del gpus[g.index]
        d.put(msgspec.structs.replace(n, gpus=gpus))
        return "done", f"GPU {g.index} of node {n.node_id} uncordoned"
    if not n.operator_cordon:
        drained = f" (it is drained: {n.operator_drain}; resume it)" if n.operator_drain else ""
        return "nothing_to_do", f"node {n.node_id} is not cordoned by an operator{drained}"
    still = (
        f"drained: {n.operator_drain}"
        if n.operator_drain
        else f"{n.status}: {n.reason}"
        if n.status == "failed"
        else ""
    )
    if not still:
        d.emit(Uncordoned(**d.env(n.node_id), node_id=n.node_id, scope="node", reason=a.reason))
    d.put(msgspec.structs.replace(n, cordoned=bool(still), operator_cordon=""))
    if still:
        return "done", f"node {n.node_id}: operator's cordon lifted; still cordoned ({still})"
    return "done", f"node {n.node_id} uncordoned"
