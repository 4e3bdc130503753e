"""The allocator's decisions: commands and health news in, ledger events out. Pure.

    decision = decide(ledger, command, now, place=first_fit, hops=fabric_hops, config=config)
    apply(ledger, decision.events)   # `handle` does both; the service also publishes the events

`decide` reads the ledger and returns data: the events to publish, which are also the changes
(see ledger.py). It never changes the ledger, reads no clock (time is `now`) and derives event ids
from the input's id, so the same input on the same ledger gives the same events.

Idempotency: a ProposePlacement, RequestAllocation, RenewLease or SetQuota whose id the ledger
has answered gets that answer again, the same events, with `repeat` set, and changes nothing. The
allocation granted to a command has the command's id, so one command is at most one grant. A
ReleaseAllocation of an allocation that a release ended gets that release's events again. Health
news (NodeFailed ...) is idempotent by state: news that changes nothing gives no events.

Commit rule of ProposePlacement (an exact assignment computed on ledger version V). The checks
run in this order; the first that fails is the rejection's reason:

1. invalid: no assignment, V above the ledger's version, a lease outside (0 s, 30 days], a node never
   registered, a GPU index the node does not have, a GPU named twice, milli outside 1..1000, a
   fraction's memory outside 1..the GPU's, a whole GPU with less than all its memory, a MIG
   profile the GPU cannot run, or no kind fits the shape (see `_shape`); for remote use, a client
   with no fabric distance to the node, or farther than `max_remote_hops`.
2. stale: the proposal's `fencing_term` is below the highest term the ledger granted to its
   `scheduler_group` (a deposed leader's proposal: fencing, checked before the nodes), or a named
   node was removed, or its hardware (CPU, memory, GPU ids, models, memory) changed, after V: the
   proposal describes hardware that is no longer there.
3. node_not_ready: a named node is cordoned, draining or failed, or a named GPU failed or is
   cordoned.
4. conflict: the assignment does not fit now, and a GPU (or, for host CPU and memory, a node)
   it names changed after V: another allocation was committed on it first; the proposer should
   retry on fresh state. would_exceed_capacity: it does not fit now and nothing it names changed
   after V, so it never fit.
5. over_quota: the admission rule of quotas.py refuses it.

Optimistic concurrency is per GPU: a proposal whose GPUs are still free is committed even when
other GPUs of its nodes changed after V, as in Omega's fine-grained conflict detection, so two
schedulers proposing on one node at once both win unless they want the same shares. With
`AllocatorConfig.fine_grained` off, a proposal is also `stale` when a node it names changed at
all after V (it still fits but was computed on an old picture of the node).

RequestAllocation: the allocator filters the nodes with a GPU able to serve the request (model,
MIG profile; for remote use within `max_remote_hops` of the client: none within reach is
`invalid`, none at all `would_exceed_capacity`), keeps the ready ones (none: `node_not_ready`) and
asks the placer. Its answer is checked like a proposal computed on the current version. When the
quota refuses it, the models it used are excluded and the placer asked again; `over_quota` when
nothing is left, `would_exceed_capacity` when the placer finds nothing.

ReplaceGangMember (a gang that declared `on_member_failure` replace lost a member): `invalid` when
the allocation is not live, not the job's, not such a gang, the failed node is not a member, the
assignment is not one node outside the gang with whole GPUs as many as each member holds, or V is
above the ledger's version; then fencing, removed or changed hardware (`stale`) and the new node's
readiness (a leaf cordon counts: it is multi-node work), fit (`conflict` / `would_exceed_capacity`)
and quota (only what the new member adds beyond the failed member's share) as for a proposal. The
answer is, in one version, AllocationRevoked for the failed member (unless a failure revoked it
already) and one AllocationGranted for the new node, into the same allocation id, at the failed
member's rank in `nodes`, with the allocation's lease; the other members get no event. A failure
(NodeFailed, GpuFailed, NodeDeregistered, a changed GPU) revokes such a gang on the failed node
only; expiry and release end every member.

Leases: a grant's lease runs `lease_s` from `now`. RenewLease by the allocation's owner (the
job id, in `holder`) sets the expiry to max(current expiry, now + extend_s); a renewal at or after
the expiry, or by anyone else, is rejected (`invalid`). `expire(ledger, now)` ends every
allocation whose expiry is at or before `now` (AllocationExpired, one per node).

Health: NodeRegistered adds a node or updates its inventory (a GPU whose id, model or memory
changed is a new GPU: allocations on the old one are revoked). NodeFailed, GpuFailed,
NodeDeregistered revoke every allocation with a share there, a gang on all its nodes, and remote
allocations whose client failed. Cordoned (node scope: the node; leaf scope: multi-node work on
the node; gpu scope: the GPU), DrainRequested stop those new grants but revoke nothing; Uncordoned
lifts the cordon of its own scope only (node scope: drain too), so that lifting a leaf cordon never
lifts a node's. NodeRecovered clears failed. A rail cordon does not concern the pool.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from typing import NamedTuple, TypedDict

import msgspec

from ibpool_proto import pool as proto
from ibpool_proto.health import (
    Cordoned,
    DrainRequested,
    GpuFailed,
    GpuRecovered,
    NodeFailed,
    NodeRecovered,
    Uncordoned,
)
from ibpool_proto.node import NodeDeregistered, NodeRegistered
from ibpool_proto.pool import (
    AllocationExpired,
    AllocationKind,
    AllocationRejected,
    AllocationReleased,
    AllocationRevoked,
    GpuAssignment,
    RejectReason,
    ReleaseAllocation,
    RenewLease,
    ResourceRequest,
    WorkloadSpec,
)

from ..fabric.view import NoFabric
from ..ids import event_id
from . import mig, quotas
from .enforcement import DeviceShare, enforcement_for
from .ledger import WHOLE, Allocation, Gpu, GpuGrant, Ledger, Node, apply, pool_gpus
from .messages import (
    AllocationGranted,
    LeaseRenewed,
    LedgerEvent,
    PoolGpu,
    PoolNodeUpdated,
    ProposePlacement,
    QuotaChanged,
    RequestAllocation,
    SetQuota,
)
from .placement import GpuPlacer, PlacementRequest, first_fit
from .quotas import Share

Input = (
    proto.ProposePlacement
    | proto.ReplaceGangMember
    | proto.RequestAllocation
    | ReleaseAllocation
    | RenewLease
    | SetQuota
    | NodeRegistered
    | NodeDeregistered
    | NodeFailed
    | NodeRecovered
    | GpuFailed
    | GpuRecovered
    | Cordoned
    | Uncordoned
    | DrainRequested
)
"""What the allocator decides on: its commands and the node and health news it follows."""

Hops = Callable[[str, str], int | None]
"""Fabric distance in links between two node ids (as `FabricIndex.hops`), None when no path joins them;
may raise KeyError for a node the fabric does not have, `NoFabric` while it knows no fabric at all."""


class AllocatorConfig(msgspec.Struct, frozen=True, kw_only=True):
    source: str = "pool_allocator"
    max_remote_hops: int | None = 4
    fine_grained: bool = True


DEFAULT_CONFIG = AllocatorConfig()


class Decision(msgspec.Struct, frozen=True, kw_only=True):
    """The events to publish, which are also the ledger's changes (`apply` them), in order.

    repeat    the input was answered before: these are that answer's events and change nothing
    note      why nothing happened, when there are no events
    conflict  with `repeat`: the id was answered for another request (another job, or a live
              allocation of another tenant, queue or kind), and why; "" when it is this one again
    """

    events: tuple[LedgerEvent, ...] = ()
    repeat: bool = False
    note: str = ""
    conflict: str = ""

    @property
    def granted(self) -> list[AllocationGranted]:
        return [e for e in self.events if isinstance(e, AllocationGranted)]

    @property
    def rejection(self) -> AllocationRejected | None:
        return next((e for e in self.events if isinstance(e, AllocationRejected)), None)


def decide(
    ledger: Ledger,
    command: Input,
    now: dt.datetime,
    *,
    place: GpuPlacer = first_fit,
    hops: Hops | None = None,
    config: AllocatorConfig = DEFAULT_CONFIG,
) -> Decision:
    """What `command` does to `ledger` at `now`, as events; the ledger is not changed."""
    ctx = _Ctx(ledger, now, config, command.id, place, hops)
    match command:
        case (
            proto.ProposePlacement() | proto.ReplaceGangMember() | proto.RequestAllocation() | RenewLease() | SetQuota()
        ) if command.id in ledger.answers:
            answer = ledger.answer(command.id)
            return Decision(events=answer, repeat=True, conflict=_answered_otherwise(ledger, answer, command))
        case proto.ProposePlacement():
            return _propose(ctx, command)
        case proto.ReplaceGangMember():
            return _replace(ctx, command)
        case proto.RequestAllocation():
            return _request(ctx, command)
        case ReleaseAllocation():
            return _release(ctx, command)
        case RenewLease():
            return _renew(ctx, command)
        case SetQuota():
            return _set_quota(ctx, command)
        case NodeRegistered():
            return _registered(ctx, command)
        case _:
            return _health(ctx, command)


def _answered_otherwise(ledger: Ledger, answer: tuple[LedgerEvent, ...], command: Input) -> str:
    """Why the first answer to `command.id` was to another request: its events name another job, or
    the live allocation of that id has another tenant, queue or kind; "" when it is this one again."""
    job = getattr(command, "job_id", None)
    if job is not None:
        for ev in answer:
            other = getattr(ev, "job_id", None)
            if other is not None and other != job:
                return f"id {command.id} was used for job {other}, not {job}"
    alloc = ledger.allocations.get(command.id)
    if isinstance(command, proto.RequestAllocation) and alloc is not None:
        held = (alloc.tenant, alloc.queue, alloc.kind)
        asked = (command.tenant, command.queue, command.request.kind)
        if held != asked:
            return f"id {command.id} holds tenant/queue/kind {'/'.join(held)}, asked {'/'.join(asked)}"
    return ""


def expire(ledger: Ledger, now: dt.datetime, *, config: AllocatorConfig = DEFAULT_CONFIG) -> Decision:
    """End every allocation whose lease ran out at or before `now`: AllocationExpired per node."""
    due = sorted((a for a in ledger.allocations.values() if a.lease_expires_at <= now), key=_by_expiry)
    if not due:
        return Decision()
    ctx = _Ctx(ledger, now, config, f"expire@{ledger.version + 1}", first_fit, None)
    events: list[LedgerEvent] = []
    for alloc in due:
        for node_id in alloc.held_nodes:
            events.append(
                AllocationExpired(
                    **ctx.envelope(node_id),
                    allocation_id=alloc.allocation_id,
                    job_id=alloc.job_id,
                    node_id=node_id,
                    ledger_version=ctx.version,
                )
            )
    return Decision(events=tuple(events))


def handle(
    ledger: Ledger,
    command: Input,
    now: dt.datetime,
    *,
    place: GpuPlacer = first_fit,
    hops: Hops | None = None,
    config: AllocatorConfig = DEFAULT_CONFIG,
) -> Decision:
    """Decide, then apply the decision to `ledger` (which changes); returns the decision."""
    decision = decide(ledger, command, now, place=place, hops=hops, config=config)
    apply(ledger, decision.events)
    return decision


class _Envelope(TypedDict):
    id: str
    occurred_at: dt.datetime
    source: str
    key: str


class _Ctx:
    def __init__(
        self, ledger: Ledger, now: dt.datetime, config: AllocatorConfig, cause: str, place: GpuPlacer, hops: Hops | None
    ) -> None:
        self.ledger = ledger
        self.now = now
        self.config = config
        self.cause = cause
        self.place = place
        self.hops = hops
        self.version = ledger.version + 1
        self._n = 0

    def envelope(self, key: str) -> _Envelope:
        self._n += 1
        return _Envelope(
            id=event_id(self.now, self.cause, self._n), occurred_at=self.now, source=self.config.source, key=key
        )

    def reject(self, command_id: str, job_id: str, reason: RejectReason, detail: str) -> Decision:
        event = AllocationRejected(
            **self.envelope(job_id),
            command_id=command_id,
            job_id=job_id,
            reason=reason,
            detail=detail,
            ledger_version=self.ledger.version,
        )
        return Decision(events=(event,))

    def revoke(self, allocs: Sequence[Allocation], reason: str, failed: str | None = None) -> list[LedgerEvent]:
        """Revoke the allocations on every node they hold; a gang that declared `replace` loses only
        its member on `failed` (the node whose failure revokes), the others keep running."""
        return [
            AllocationRevoked(
                **self.envelope(node_id),
                allocation_id=a.allocation_id,
                job_id=a.job_id,
                node_id=node_id,
                ledger_version=self.version,
                reason=reason,
            )
            for a in sorted(allocs, key=lambda a: a.allocation_id)
            for node_id in a.held_nodes
            if failed is None or not a.replaceable or node_id == failed
        ]

    def node_updated(self, node: Node, reason: str, *, gpus: list[PoolGpu] | None = None) -> PoolNodeUpdated:
        return PoolNodeUpdated(
            **self.envelope(node.node_id),
            node_id=node.node_id,
            ledger_version=self.version,
            hostname=node.hostname,
            cpu_milli=node.cpu_milli,
            memory_mib=node.memory_mib,
            gpus=pool_gpus(node) if gpus is None else gpus,
            labels=dict(node.labels),
            api_url=node.api_url,
            failed=node.failed,
            cordoned=node.cordoned,
            leaf_cordoned=node.leaf_cordoned,
            draining=node.draining,
            reason=reason,
        )


class _Ask(NamedTuple):
    """One GPU's share before commit (a MIG instance's start is chosen at commit)."""

    node_id: str
    gpu_index: int
    model: str
    milli: int
    memory_mib: int
    mig_profile: str | None


class _Claim(NamedTuple):
    command_id: str
    job_id: str
    tenant: str
    queue: str
    kind: AllocationKind
    asks: list[_Ask]
    lease_s: float
    workload: WorkloadSpec | None
    cpu_milli: int
    host_memory_mib: int
    client_node_id: str | None
    hops: int | None
    scheduler_group: str = ""
    fencing_term: int | None = None
    on_member_failure: proto.MemberFailure = "restart"


class _Refusal(NamedTuple):
    reason: RejectReason
    detail: str


def _extras(cmd: proto.ProposePlacement | proto.RequestAllocation) -> tuple[str | None, int, int]:
    if isinstance(cmd, ProposePlacement | RequestAllocation):
        return cmd.client_node_id, cmd.cpu_milli, cmd.host_memory_mib
    return None, 0, 0


def _propose(ctx: _Ctx, cmd: proto.ProposePlacement) -> Decision:
    ledger, since = ctx.ledger, cmd.ledger_version
    client, cpu, host_memory = _extras(cmd)

    def reject(reason: RejectReason, detail: str) -> Decision:
        return ctx.reject(cmd.id, cmd.job_id, reason, detail)

    if not cmd.assignments:
        return reject("invalid", "the proposal assigns no GPU")
    if (problem := _amounts_problem(cmd.lease_s, cpu, host_memory)) is not None:
        return reject("invalid", problem)
    shaped = _admitted(ledger, cmd, {a.node_id for a in cmd.assignments}, client)
    if isinstance(shaped, _Refusal):
        return reject(*shaped)
    kind, asks = shaped
    distance: int | None = None
    if client is not None:
        reach = _distance(ctx, client, asks[0].node_id)
        if isinstance(reach, str):
            return reject("invalid", reach)
        distance = reach
    claim = _Claim(
        cmd.id,
        cmd.job_id,
        cmd.tenant,
        cmd.queue,
        kind,
        asks,
        cmd.lease_s,
        cmd.workload,
        cpu,
        host_memory,
        client,
        distance,
        cmd.scheduler_group,
        cmd.fencing_term,
        cmd.on_member_failure if kind == "gang" else "restart",
    )
    return _commit(ctx, claim, since)


def _admitted(
    ledger: Ledger, cmd: proto.ProposePlacement | proto.ReplaceGangMember, nodes: set[str], client: str | None
) -> tuple[AllocationKind, list[_Ask]] | _Refusal:
    """What a proposal and a member replacement both must pass: computed on a version the ledger has
    reached, the proposer not fenced, every node of `nodes` usable since that version; then the
    kind and exact shares of its assignments."""
    since = cmd.ledger_version
    if not 0 <= since <= ledger.version:
        return _Refusal("invalid", f"computed on version {since}; the ledger is at {ledger.version}")
    refusal = _fenced(ledger, cmd.scheduler_group, cmd.fencing_term) or next(
        filter(None, (_node_refusal(ledger, n, since) for n in sorted(nodes))), None
    )
    if refusal is not None:
        return _Refusal(*refusal)
    shaped = _shape(ledger, cmd.assignments, client)
    return _Refusal("invalid", shaped) if isinstance(shaped, str) else shaped


def _fenced(ledger: Ledger, group: str, term: int | None) -> tuple[RejectReason, str] | None:
    """`stale` for a proposer whose term is below the newest its scheduler group was granted."""
    newest = ledger.terms.get(group)
    if term is not None and newest is not None and term < newest:
        return (
            "stale",
            f"fenced: term {term} of scheduler group {group!r} is below term {newest},"
            " which was granted a placement since",
        )
    return None


def _node_refusal(ledger: Ledger, node_id: str, since: int) -> tuple[RejectReason, str] | None:
    """Why a placement computed on ledger version `since` may not use `node_id`: unknown, or removed
    or changed in hardware after that version (`stale`: the proposer should look again)."""
    node = ledger.nodes.get(node_id)
    if node is None:
        gone = ledger.removed_nodes.get(node_id)
        if gone is not None and gone > since:
            return "stale", f"node {node_id} was removed at version {gone}, after {since}"
        return "invalid", f"unknown node {node_id}"
    if node.inventory_version > since:
        return "stale", f"node {node_id} changed hardware at version {node.inventory_version}, after {since}"
    return None


def _replace(ctx: _Ctx, cmd: proto.ReplaceGangMember) -> Decision:
    """Replace the failed member of a gang that declared `replace` (see the module docstring)."""
    ledger, since = ctx.ledger, cmd.ledger_version

    def reject(reason: RejectReason, detail: str) -> Decision:
        return ctx.reject(cmd.id, cmd.job_id, reason, detail)

    alloc = ledger.allocations.get(cmd.allocation_id)
    if alloc is None:
        return reject("invalid", f"allocation {cmd.allocation_id} is not live: no member to replace")
    if alloc.job_id != cmd.job_id:
        return reject("invalid", f"allocation {cmd.allocation_id} belongs to job {alloc.job_id}, not {cmd.job_id}")
    if not alloc.replaceable:
        return reject(
            "invalid", f"allocation {cmd.allocation_id} is not a gang that declared on_member_failure replace"
        )
    if cmd.failed_node_id not in alloc.nodes:
        return reject("invalid", f"node {cmd.failed_node_id} is not a member of allocation {cmd.allocation_id}")
    if ctx.now >= alloc.lease_expires_at:  # the new member would be expired at once
        return reject(
            "invalid", f"the lease of allocation {cmd.allocation_id} ran out at {alloc.lease_expires_at.isoformat()}"
        )
    new_nodes = {a.node_id for a in cmd.assignments}
    if len(new_nodes) != 1:
        return reject("invalid", f"a replacement is one node; the assignments name {len(new_nodes)}")
    (new_node,) = new_nodes
    if new_node in alloc.nodes:
        return reject("invalid", f"node {new_node} is already a member of allocation {cmd.allocation_id}")
    shaped = _admitted(ledger, cmd, {new_node}, None)
    if isinstance(shaped, _Refusal):
        return reject(*shaped)
    _, asks = shaped
    survivors = [n for n in alloc.held_nodes if n != cmd.failed_node_id]
    model_member = survivors[0] if survivors else alloc.held_nodes[0]
    per_member = sum(1 for g in alloc.grants if g.node_id == model_member)
    if any(a.milli < WHOLE or a.mig_profile for a in asks) or len(asks) != per_member:
        return reject(
            "invalid", f"a member of this gang holds {per_member} whole GPUs; the replacement names {len(asks)}"
        )
    claim = _Claim(
        cmd.id,
        alloc.job_id,
        alloc.tenant,
        alloc.queue,
        "gang",
        asks,
        1.0,  # unused: the new member gets the allocation's lease (`expires` below)
        cmd.workload,
        alloc.cpu_milli,
        alloc.host_memory_mib,
        None,
        None,
        cmd.scheduler_group,
        cmd.fencing_term,
        alloc.on_member_failure,
    )
    checked = _check(ctx, claim, since, gang=True)
    if isinstance(checked, _Refusal):
        return reject(checked.reason, checked.detail)
    # Quota: the new member's share, less the failed member's share it takes over when still held.
    lost = [g for g in alloc.grants if g.node_id == cmd.failed_node_id]
    freed = _adds(lost)
    adds: dict[str, Share] = {}
    for model, share in _adds(checked).items():
        d = share - freed.get(model, Share())
        if d.milli > 0 or d.memory_mib > 0:
            adds[model] = Share(milli=max(0, d.milli), memory_mib=max(0, d.memory_mib))
    why = quotas.refusal(ledger.quotas, ledger.usage, alloc.tenant, alloc.queue, adds) if adds else None
    if why is not None:
        return reject("over_quota", why)
    events: list[LedgerEvent] = []
    if lost:
        events += [
            AllocationRevoked(
                **ctx.envelope(cmd.failed_node_id),
                allocation_id=alloc.allocation_id,
                job_id=alloc.job_id,
                node_id=cmd.failed_node_id,
                ledger_version=ctx.version,
                reason=f"member replaced by node {new_node}" + (f": {cmd.reason}" if cmd.reason else ""),
            )
        ]
    members = [new_node if n == cmd.failed_node_id else n for n in alloc.nodes]
    events += _grant(
        ctx,
        claim,
        checked,
        allocation_id=alloc.allocation_id,
        members=members,
        replaces=cmd.failed_node_id,
        expires=alloc.lease_expires_at,
    )
    return Decision(events=tuple(events))


def _distance(ctx: _Ctx, client: str, node_id: str) -> int | str:
    """Hops from the client to the serving node, or why a remote grant cannot go there."""
    if ctx.hops is None:
        return "remote use needs fabric distances, and the allocator has none"
    try:
        d = ctx.hops(client, node_id)
    except NoFabric as e:
        return f"remote use needs fabric distances, and the allocator has none: {e}"
    except KeyError:
        d = None
    if d is None:
        return f"no fabric path from client {client} to node {node_id}"
    limit = ctx.config.max_remote_hops
    if limit is not None and d > limit:
        return f"client {client} is {d} hops from node {node_id}, over the limit of {limit}"
    return d


def _shape(
    ledger: Ledger, assignments: Sequence[GpuAssignment], client: str | None
) -> tuple[AllocationKind, list[_Ask]] | str:
    """The kind and the exact shares of an assignment list on known nodes, or why it is invalid.

    remote: a client is named; one node; whole GPUs or one fraction.  gang: several nodes, whole
    GPUs.  mig: one MIG instance.  fraction: one share of less than 1000 milli.  whole: whole GPUs
    of one node.
    """
    seen: set[tuple[str, int]] = set()
    asks: list[_Ask] = []
    for a in assignments:
        node = ledger.nodes[a.node_id]
        gpu = node.gpu(a.gpu_index)
        if gpu is None:
            return f"node {a.node_id} has no GPU {a.gpu_index}"
        if (a.node_id, a.gpu_index) in seen:
            return f"GPU {a.gpu_index} of node {a.node_id} is named twice"
        seen.add((a.node_id, a.gpu_index))
        if a.mig_profile is not None:
            if not gpu.mig_capable or a.mig_profile not in mig.MIG_PROFILES.get(gpu.model, {}):
                return f"GPU {a.gpu_index} of node {a.node_id} ({gpu.model}) cannot run MIG profile {a.mig_profile}"
            p = mig.profile_of(gpu.model, a.mig_profile)
            asks.append(_Ask(a.node_id, a.gpu_index, gpu.model, p.milli, p.memory_mib, p.name))
            continue
        if not 1 <= a.milli <= WHOLE:
            return f"milli {a.milli} is outside 1..{WHOLE}"
        if a.milli == WHOLE:
            if a.memory_mib not in (None, gpu.memory_mib):
                return f"a whole GPU comes with all its memory ({gpu.memory_mib} MiB), not {a.memory_mib}"
            memory = gpu.memory_mib
        else:
            memory = a.memory_mib if a.memory_mib is not None else max(1, gpu.memory_mib * a.milli // WHOLE)
            if not 1 <= memory <= gpu.memory_mib:
                return f"memory {memory} MiB is outside 1..{gpu.memory_mib} of GPU {a.gpu_index} of node {a.node_id}"
        asks.append(_Ask(a.node_id, a.gpu_index, gpu.model, a.milli, memory, None))
    nodes = {a.node_id for a in asks}
    partial = [a for a in asks if a.mig_profile is not None or a.milli < WHOLE]
    if client is not None:
        if len(nodes) > 1 or any(a.mig_profile for a in asks) or (partial and len(asks) > 1):
            return "remote use is whole GPUs or one fraction on one node"
        return "remote", asks
    if len(nodes) > 1:
        return ("gang", asks) if not partial else "a gang is whole GPUs only"
    if partial:
        if len(asks) > 1:
            return "a fraction or MIG instance is one GPU share; whole GPUs do not go with it"
        return ("mig" if asks[0].mig_profile else "fraction"), asks
    return "whole", asks


def _check(ctx: _Ctx, claim: _Claim, since: int | None, *, gang: bool = False) -> list[GpuGrant] | _Refusal:
    """The shares with their MIG starts when the claim fits the ledger now, or the refusal.
    `gang`: the claim is part of a multi-node allocation even on one node (a replaced member)."""
    ledger = ctx.ledger
    node_ids = sorted({a.node_id for a in claim.asks})
    nodes = {n: ledger.nodes[n] for n in node_ids}
    multi_node = gang or len(nodes) > 1
    for node in nodes.values():
        if not node.ready:
            return _Refusal("node_not_ready", f"node {node.node_id} is {node.state}")
        if not node.ready_for(multi_node):
            return _Refusal("node_not_ready", f"node {node.node_id} is leaf-cordoned: no multi-node work there")
    for a in claim.asks:
        gpu = nodes[a.node_id].gpu(a.gpu_index)
        assert gpu is not None
        if not gpu.ready:
            return _Refusal("node_not_ready", f"GPU {a.gpu_index} of node {a.node_id} is {_gpu_state(gpu.failed)}")
    grants = []
    for a in claim.asks:
        gpu = nodes[a.node_id].gpu(a.gpu_index)
        assert gpu is not None
        instance = None
        if a.mig_profile is not None:
            start = gpu.mig_start(a.mig_profile)
            fits = start is not None
            instance = mig.MigInstance(profile=a.mig_profile, start=start) if start is not None else None
            lack = f"no free placement for {a.mig_profile}"
        else:
            fits = gpu.fits_whole() if a.milli == WHOLE else gpu.fits_share(a.milli, a.memory_mib)
            lack = f"{gpu.free_milli} milli and {gpu.free_memory_mib} MiB free" + (" (MIG)" if gpu.mig else "")
        if not fits:
            where = f"GPU {a.gpu_index} of node {a.node_id} has {lack}"
            if since is not None and gpu.version > since:
                return _Refusal("conflict", f"{where}; it changed at version {gpu.version}, after {since}")
            return _Refusal("would_exceed_capacity", where)
        grants.append(
            GpuGrant(
                node_id=a.node_id,
                gpu_index=a.gpu_index,
                model=a.model,
                milli=a.milli,
                memory_mib=a.memory_mib,
                mig=instance,
            )
        )
    for node in nodes.values():
        if node.free_cpu_milli < claim.cpu_milli or node.free_memory_mib < claim.host_memory_mib:
            where = f"node {node.node_id} has {node.free_cpu_milli} CPU milli and {node.free_memory_mib} MiB free"
            if since is not None and node.version > since:
                return _Refusal("conflict", f"{where}; it changed at version {node.version}, after {since}")
            return _Refusal("would_exceed_capacity", where)
    if since is not None and not ctx.config.fine_grained:
        moved = [n.node_id for n in nodes.values() if n.version > since]
        if moved:
            return _Refusal("stale", f"node {moved[0]} changed after version {since}")
    return grants


def _gpu_state(failed: bool) -> str:
    return "failed" if failed else "cordoned"


def _adds(grants: Sequence[GpuGrant]) -> dict[str, Share]:
    out: dict[str, Share] = {}
    for g in grants:
        out[g.model] = out.get(g.model, Share()) + Share(milli=g.milli, memory_mib=g.memory_mib)
    return out


def _commit(ctx: _Ctx, claim: _Claim, since: int | None) -> Decision:
    checked = _check(ctx, claim, since)
    if isinstance(checked, _Refusal):
        return ctx.reject(claim.command_id, claim.job_id, checked.reason, checked.detail)
    why = quotas.refusal(ctx.ledger.quotas, ctx.ledger.usage, claim.tenant, claim.queue, _adds(checked))
    if why is not None:
        return ctx.reject(claim.command_id, claim.job_id, "over_quota", why)
    return Decision(events=tuple(_grant(ctx, claim, checked)))


def _grant(
    ctx: _Ctx,
    claim: _Claim,
    grants: list[GpuGrant],
    *,
    allocation_id: str | None = None,
    members: list[str] | None = None,
    replaces: str | None = None,
    expires: dt.datetime | None = None,
) -> list[LedgerEvent]:
    """One AllocationGranted per node of `grants`. A replaced gang member (`replaces`) goes into the
    existing `allocation_id`, with the allocation's `members` (rank order) and its lease `expires`."""
    # In the order of the claim's assignments: for a scheduler's proposal that is the gang's rank order.
    node_ids = list(dict.fromkeys(g.node_id for g in grants))
    if expires is None:
        expires = ctx.now + dt.timedelta(seconds=claim.lease_s)
    events: list[LedgerEvent] = []
    for node_id in node_ids:
        node = ctx.ledger.nodes[node_id]
        part = [g for g in grants if g.node_id == node_id]
        shares = []
        for g in part:
            gpu = node.gpu(g.gpu_index)
            assert gpu is not None
            shares.append(
                DeviceShare(index=g.gpu_index, uuid=gpu.uuid, milli=g.milli, memory_mib=g.memory_mib, mig=g.mig)
            )
        remote = claim.client_node_id is not None
        events.append(
            AllocationGranted(
                **ctx.envelope(node_id),
                allocation_id=allocation_id or claim.command_id,
                job_id=claim.job_id,
                node_id=node_id,
                kind=claim.kind,
                assignments=[
                    GpuAssignment(
                        node_id=node_id,
                        gpu_index=g.gpu_index,
                        milli=g.milli,
                        memory_mib=g.memory_mib,
                        mig_profile=g.mig.profile if g.mig else None,
                    )
                    for g in part
                ],
                enforcement=enforcement_for(shares),
                lease_expires_at=expires,
                ledger_version=ctx.version,
                tenant=claim.tenant,
                workload=claim.workload,
                queue=claim.queue,
                command_id=claim.command_id,
                nodes=members if members is not None else node_ids,
                cpu_milli=claim.cpu_milli,
                host_memory_mib=claim.host_memory_mib,
                client_node_id=claim.client_node_id,
                endpoint=(node.api_url or node.hostname or node.node_id) if remote else None,
                hops=claim.hops,
                scheduler_group=claim.scheduler_group,
                fencing_term=claim.fencing_term,
                on_member_failure=claim.on_member_failure,
                replaces=replaces,
            )
        )
    return events


def _request(ctx: _Ctx, cmd: proto.RequestAllocation) -> Decision:
    ledger, r = ctx.ledger, cmd.request
    client, cpu, host_memory = _extras(cmd)

    def reject(reason: RejectReason, detail: str) -> Decision:
        return ctx.reject(cmd.id, cmd.job_id, reason, detail)

    problem = _request_problem(r, client) or _amounts_problem(cmd.lease_s, cpu, host_memory)
    if problem is not None:
        return reject("invalid", problem)
    if not cmd.additional and (held := _held_by(ledger, cmd.job_id)) is not None:
        return reject(
            "conflict",
            f"job {cmd.job_id} already holds allocation {held}; release it first, or ask with additional: true",
        )
    what = _describe(r)
    matching: list[Node] = []
    distances: dict[str, int] = {}
    unreachable = ""
    for node in ledger.nodes.values():
        if not any(_serves(g.model, g.mig_capable, r) for g in node.gpus):
            continue
        if client is not None:
            d = _distance(ctx, client, node.node_id)
            if isinstance(d, str):
                unreachable = d
                continue
            distances[node.node_id] = d
        matching.append(node)
    if not matching:
        if unreachable:
            return reject("invalid", f"no node with {what} is within reach: {unreachable}")
        return reject("would_exceed_capacity", f"no node has {what}")
    ready = [
        n
        for n in matching
        if n.ready_for(r.hosts > 1) and any(g.ready and _serves(g.model, g.mig_capable, r) for g in n.gpus)
    ]
    if not ready:
        return reject("node_not_ready", f"every node with {what} is cordoned, draining or failed")
    excluded: list[str] = []
    over = ""
    for _ in range(len({g.model for n in ready for g in n.gpus}) + 1):
        candidates = tuple(n.node_id for n in ready if any(g.model not in excluded for g in n.gpus))
        want = PlacementRequest(
            request=r,
            nodes=candidates,
            excluded_models=tuple(excluded),
            cpu_milli=cpu,
            host_memory_mib=host_memory,
            client_node_id=client,
        )
        picked = ctx.place(ledger, want) if candidates else None
        if picked is None:
            break
        shaped = _placed(ledger, want, picked)
        if isinstance(shaped, str):
            return reject("invalid", f"the placer's answer does not fit the request: {shaped}")
        asks = shaped
        hops = distances.get(asks[0].node_id) if client is not None else None
        claim = _Claim(
            cmd.id,
            cmd.job_id,
            cmd.tenant,
            cmd.queue,
            r.kind,
            asks,
            cmd.lease_s,
            cmd.workload,
            cpu,
            host_memory,
            client,
            hops,
        )
        checked = _check(ctx, claim, None)
        if isinstance(checked, _Refusal):
            return reject(checked.reason, f"the placer's answer does not fit: {checked.detail}")
        why = quotas.refusal(ledger.quotas, ledger.usage, cmd.tenant, cmd.queue, _adds(checked))
        if why is None:
            return Decision(events=tuple(_grant(ctx, claim, checked)))
        over = why
        fresh = sorted({a.model for a in asks} - set(excluded))
        if not fresh:
            break
        excluded += fresh
    if over:
        return reject("over_quota", over)
    return reject("would_exceed_capacity", f"no ready node has {what} free")


def _serves(model: str, mig_capable: bool, r: ResourceRequest) -> bool:
    if r.gpu_model is not None and model != r.gpu_model:
        return False
    return r.mig_profile is None or (mig_capable and r.mig_profile in mig.MIG_PROFILES.get(model, {}))


def _describe(r: ResourceRequest) -> str:
    model = r.gpu_model or "any model"
    if r.mig_profile:
        return f"MIG {r.mig_profile} ({model})"
    gpus = f"{r.gpus_per_host} whole GPU" + ("s" if r.gpus_per_host != 1 else "")
    if r.kind == "gang":
        return f"{gpus} on each of {r.hosts} hosts ({model})"
    if r.milli < WHOLE:
        return f"{r.milli} milli of a GPU ({model})"
    return f"{gpus} ({model})"


# The longest lease a grant or a renewal may ask (30 days): every lease becomes a timestamp, and a
# lease far beyond any job's life is a mistake or an attack (1e16 s overflows a datetime).
MAX_LEASE_S = 30 * 86_400.0
# Host CPU and memory a request may ask beside its GPUs: bounds far above any node's.
MAX_CPU_MILLI = 1 << 30
MAX_HOST_MEMORY_MIB = 1 << 40


def _held_by(ledger: Ledger, job_id: str) -> str | None:
    """The id of a live allocation of `job_id` (the first by id), or None. A scan of the live
    allocations: only the direct `RequestAllocation` path asks, not the scheduler's proposals."""
    found = [a.allocation_id for a in ledger.allocations.values() if a.job_id == job_id]
    return min(found) if found else None


def _amounts_problem(lease_s: float, cpu_milli: int, host_memory_mib: int) -> str | None:
    """What is wrong with a command's lease and host amounts (NaN and infinity included), or None."""
    if not 0 < lease_s <= MAX_LEASE_S:
        return f"lease_s must be within (0, {MAX_LEASE_S:.0f}] s, got {lease_s}"
    if not 0 <= cpu_milli <= MAX_CPU_MILLI or not 0 <= host_memory_mib <= MAX_HOST_MEMORY_MIB:
        return "cpu_milli and host_memory_mib must not be negative (nor absurdly large)"
    return None


def _request_problem(r: ResourceRequest, client: str | None) -> str | None:
    if r.gpus_per_host < 1 or r.hosts < 1:
        return "gpus and hosts must be at least 1"
    if not 1 <= r.milli <= WHOLE:
        return f"milli {r.milli} is outside 1..{WHOLE}"
    if r.memory_mib is not None and r.memory_mib < 1:
        return "memory_mib must be positive"
    if (client is not None) != (r.kind == "remote"):
        return "a client node goes with kind remote, and kind remote needs one"
    if r.kind != "mig" and r.mig_profile is not None:
        return "a MIG profile goes with kind mig"
    single = r.gpus_per_host == 1 and r.hosts == 1
    match r.kind:
        case "whole":
            ok, rule = r.milli == WHOLE and r.hosts == 1, "whole: milli 1000 on one host"
        case "fraction":
            ok, rule = r.milli < WHOLE and single, "fraction: less than 1000 milli of one GPU"
        case "mig":
            known = any(r.mig_profile in mig.MIG_PROFILES.get(m, {}) for m in _models_for(r))
            ok, rule = single and known, "mig: one instance of a profile the model has"
        case "gang":
            ok, rule = r.milli == WHOLE, "gang: whole GPUs on every host"
        case _:
            ok, rule = (
                r.hosts == 1 and (r.milli == WHOLE or r.gpus_per_host == 1),
                "remote: whole GPUs or one fraction on one node",
            )
    return None if ok else f"not a valid {rule}"


def _models_for(r: ResourceRequest) -> list[str]:
    return [r.gpu_model] if r.gpu_model is not None else list(mig.MIG_PROFILES)


def _placed(ledger: Ledger, want: PlacementRequest, picked: list[GpuAssignment]) -> list[_Ask] | str:
    """The placer's answer as shares, or how it departs from the request."""
    if not picked or any(a.node_id not in ledger.nodes for a in picked):
        return "no GPU, or an unknown node"
    r = want.request
    shaped = _shape(ledger, picked, want.client_node_id)
    if isinstance(shaped, str):
        return shaped
    _, asks = shaped
    nodes = {a.node_id for a in asks}
    if not nodes <= set(want.nodes):
        return f"it uses nodes that are not candidates: {sorted(nodes - set(want.nodes))}"
    if not all(want.allows(a.model) for a in asks):
        return "it uses a GPU model the request does not allow"
    per_node = {n: sum(1 for a in asks if a.node_id == n) for n in nodes}
    if r.kind == "mig":
        ok = len(asks) == 1 and asks[0].mig_profile == r.mig_profile
    elif r.kind == "gang":
        ok = len(nodes) == r.hosts and all(c == r.gpus_per_host for c in per_node.values())
    elif r.milli < WHOLE:
        ok = len(asks) == 1 and asks[0].milli == r.milli and r.memory_mib in (None, asks[0].memory_mib)
    else:
        ok = len(nodes) == 1 and len(asks) == r.gpus_per_host and all(a.milli == WHOLE for a in asks)
    return asks if ok else f"{len(asks)} shares on {len(nodes)} nodes for {_describe(r)}"


def _release(ctx: _Ctx, cmd: ReleaseAllocation) -> Decision:
    alloc = ctx.ledger.allocations.get(cmd.allocation_id)
    if alloc is None:
        ended = ctx.ledger.ends(cmd.allocation_id)
        released = tuple(e for e in ended if isinstance(e, AllocationReleased))
        if released:
            return Decision(events=released, repeat=True)
        if ended:
            return Decision(note=f"allocation {cmd.allocation_id} already ended ({type(ended[0]).__name__})")
        return Decision(note=f"no allocation {cmd.allocation_id}")
    events: list[LedgerEvent] = [
        AllocationReleased(
            **ctx.envelope(node_id),
            allocation_id=alloc.allocation_id,
            job_id=alloc.job_id,
            node_id=node_id,
            ledger_version=ctx.version,
            reason=cmd.reason,
        )
        for node_id in alloc.held_nodes
    ]
    return Decision(events=tuple(events))


def _renew(ctx: _Ctx, cmd: RenewLease) -> Decision:
    alloc = ctx.ledger.allocations.get(cmd.allocation_id)
    if alloc is None:
        return Decision(note=f"no live allocation {cmd.allocation_id}")
    if cmd.holder != alloc.owner:
        return ctx.reject(
            cmd.id, alloc.job_id, "invalid", f"{cmd.holder!r} does not hold allocation {cmd.allocation_id}"
        )
    if not 0 < cmd.extend_s <= MAX_LEASE_S:
        return ctx.reject(cmd.id, alloc.job_id, "invalid", f"extend_s must be within (0, {MAX_LEASE_S:.0f}] s")
    if ctx.now >= alloc.lease_expires_at:
        return ctx.reject(cmd.id, alloc.job_id, "invalid", f"the lease ran out at {alloc.lease_expires_at.isoformat()}")
    expires = max(alloc.lease_expires_at, ctx.now + dt.timedelta(seconds=cmd.extend_s))
    event = LeaseRenewed(
        **ctx.envelope(alloc.allocation_id),
        allocation_id=alloc.allocation_id,
        job_id=alloc.job_id,
        lease_expires_at=expires,
        ledger_version=ctx.version,
        command_id=cmd.id,
    )
    return Decision(events=(event,))


def _set_quota(ctx: _Ctx, cmd: SetQuota) -> Decision:
    if cmd.remove:
        had = ctx.ledger.quotas.get(cmd.quota.key)
        if had is None:
            scope, name, model = cmd.quota.key
            return Decision(note=f"no {scope} quota of {name!r} on {model!r} to remove")
        removed = QuotaChanged(
            **ctx.envelope(cmd.quota.name), quota=had, ledger_version=ctx.version, command_id=cmd.id, removed=True
        )
        return Decision(events=(removed,))
    problems = quotas.problems(cmd.quota)
    if problems:
        return Decision(note="; ".join(problems))
    event = QuotaChanged(**ctx.envelope(cmd.quota.name), quota=cmd.quota, ledger_version=ctx.version, command_id=cmd.id)
    return Decision(events=(event,))


def _registered(ctx: _Ctx, reg: NodeRegistered) -> Decision:
    old = ctx.ledger.nodes.get(reg.node_id)
    gpus = []
    for info in sorted(reg.gpus, key=lambda g: g.index):
        fresh = PoolGpu(
            index=info.index,
            uuid=info.uuid,
            model=info.model,
            memory_mib=info.memory_mib,
            mig_capable=info.mig_capable,
            nvlink_domain=info.nvlink_domain,
        )
        prev = old.gpu(info.index) if old else None
        if prev is not None and prev.same_device(fresh):
            fresh = msgspec.structs.replace(fresh, failed=prev.failed, cordoned=prev.cordoned)
        gpus.append(fresh)
    kept = {g.index for g in gpus if old is not None and (p := old.gpu(g.index)) is not None and p.same_device(g)}
    gone = [g for g in old.gpus if g.index not in kept] if old else []
    revoked = sorted({a for g in gone for a in g.holders})
    base = old or Node(node_id=reg.node_id)
    node = msgspec.structs.replace(
        base,
        hostname=reg.hostname,
        cpu_milli=reg.cpu_milli,
        memory_mib=reg.memory_mib,
        labels=dict(reg.labels),
        api_url=reg.api_url,
    )
    if old is not None and not revoked and node == old and pool_gpus(old) == gpus:
        return Decision(note=f"node {reg.node_id} registered as it was")
    allocs = [ctx.ledger.allocations[a] for a in revoked]
    events = ctx.revoke(allocs, f"GPU changed or removed when node {reg.node_id} registered again", reg.node_id)
    reason = "registered" if old is None else "registered again"
    return Decision(events=(*events, ctx.node_updated(node, reason, gpus=gpus)))


def _health(
    ctx: _Ctx,
    news: NodeDeregistered
    | NodeFailed
    | NodeRecovered
    | GpuFailed
    | GpuRecovered
    | Cordoned
    | Uncordoned
    | DrainRequested,
) -> Decision:
    ledger = ctx.ledger
    node = ledger.nodes.get(news.node_id)
    if node is None:
        return Decision(note=f"unknown node {news.node_id}")
    unchanged = Decision(note=f"node {news.node_id} is already so")
    match news:
        case NodeDeregistered():
            allocs = _touching(ledger, node.node_id)
            events = ctx.revoke(allocs, f"node {node.node_id} left the pool: {news.reason}", node.node_id)
            gone = PoolNodeUpdated(
                **ctx.envelope(node.node_id),
                node_id=node.node_id,
                ledger_version=ctx.version,
                removed=True,
                reason=news.reason,
            )
            return Decision(events=(*events, gone))
        case NodeFailed():
            if node.failed:
                return unchanged
            allocs = _touching(ledger, node.node_id)
            events = ctx.revoke(allocs, f"node {node.node_id} failed: {news.reason}", node.node_id)
            after = msgspec.structs.replace(node, failed=True)
            return Decision(events=(*events, ctx.node_updated(after, f"failed: {news.reason}")))
        case GpuFailed():
            gpu = node.gpu(news.gpu_index)
            if gpu is None:
                return Decision(note=f"node {node.node_id} has no GPU {news.gpu_index}")
            if gpu.failed:
                return unchanged
            allocs = [ledger.allocations[a] for a in gpu.holders]
            events = ctx.revoke(allocs, f"GPU {gpu.index} of node {node.node_id} failed: {news.reason}", node.node_id)
            after = _with_gpu(node, msgspec.structs.replace(gpu, failed=True))
            return Decision(events=(*events, ctx.node_updated(after, f"GPU {gpu.index} failed: {news.reason}")))
        case NodeRecovered():
            after = msgspec.structs.replace(node, failed=False)
            reason = "recovered"
        case GpuRecovered():  # an operator reset or replaced it (failover controller, POST .../recover)
            gpu = node.gpu(news.gpu_index)
            if gpu is None:
                return Decision(note=f"node {node.node_id} has no GPU {news.gpu_index}")
            after = _with_gpu(node, msgspec.structs.replace(gpu, failed=False))
            reason = f"GPU {gpu.index} recovered: {news.reason}"
        case Cordoned() if news.scope == "node":
            after = msgspec.structs.replace(node, cordoned=True)
            reason = f"cordoned: {news.reason}"
        case Cordoned() if news.scope == "leaf":
            after = msgspec.structs.replace(node, leaf_cordoned=True)
            reason = f"leaf-cordoned (no multi-node work): {news.reason}"
        case Cordoned() if news.scope == "gpu":
            gpu = node.gpu(news.gpu_index) if news.gpu_index is not None else None
            if gpu is None:
                return Decision(note=f"node {node.node_id} has no GPU {news.gpu_index}")
            after = _with_gpu(node, msgspec.structs.replace(gpu, cordoned=True))
            reason = f"GPU {gpu.index} cordoned: {news.reason}"
        case Uncordoned() if news.scope == "node":
            after = msgspec.structs.replace(node, cordoned=False, draining=False)
            reason = "uncordoned"
        case Uncordoned() if news.scope == "leaf":
            after = msgspec.structs.replace(node, leaf_cordoned=False)
            reason = "leaf cordon lifted"
        case Uncordoned() if news.scope == "gpu":
            gpu = node.gpu(news.gpu_index) if news.gpu_index is not None else None
            if gpu is None:
                return Decision(note=f"node {node.node_id} has no GPU {news.gpu_index}")
            after = _with_gpu(node, msgspec.structs.replace(gpu, cordoned=False))
            reason = f"GPU {gpu.index} uncordoned"
        case DrainRequested():
            after = msgspec.structs.replace(node, draining=True)
            reason = f"draining: {news.reason}"
        case _:
            return Decision(note=f"a {news.scope} cordon does not change the pool")
    if after == node:
        return unchanged
    return Decision(events=(ctx.node_updated(after, reason),))


def _touching(ledger: Ledger, node_id: str) -> list[Allocation]:
    """Allocations with a share on the node, and remote allocations whose client it is."""
    ids = ledger.nodes[node_id].holders
    ids |= {a.allocation_id for a in ledger.allocations.values() if a.client_node_id == node_id}
    return [ledger.allocations[a] for a in sorted(ids)]


def _with_gpu(node: Node, gpu: Gpu) -> Node:
    return msgspec.structs.replace(node, gpus=tuple(gpu if g.index == gpu.index else g for g in node.gpus))


def _by_expiry(a: Allocation) -> tuple[dt.datetime, str]:
    return (a.lease_expires_at, a.allocation_id)
