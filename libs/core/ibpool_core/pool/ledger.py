"""The pool ledger: every GPU of the cluster, what is granted on it, to whom and until when. Pure.

What it holds
-------------
- nodes: CPU (milli) and memory (MiB) with what is granted of them; GPUs with model, memory,
  MIG capability, state, granted milli and memory, MIG layout while partitioned, and the
  allocations holding a share; whether the node is cordoned, draining or failed;
- allocations: id (= the id of the command that asked for it), owner (the job), tenant, queue,
  kind (whole | fraction | mig | gang | remote), the exact share of every GPU on every node, host
  CPU and memory per node, lease expiry, and for remote use the client, endpoint and distance;
- quotas and the usage they are checked against (see quotas.py);
- per scheduler group, the highest fencing term a grant carried (`terms`: a proposal of a lower
  term comes from a deposed leader and is refused);
- the answer given to every command id (grants, rejections, renewals, quota changes) and the
  events that ended every allocation, so a repeated command gets the same answer: those of the
  allocations held, and of the rest the newest `past_kept` (`PAST_KEPT`);
- `version`, the ledger version: one more for every decision that changes the ledger.

How it changes
--------------
Only `apply` changes a ledger, and only from the events that `allocate.decide` returns and the
allocator publishes, so `rebuild(published events)` gives a ledger equal to the allocator's. All
events of one decision carry the version that decision made (the events of a gang, one per node,
share it); a rejection carries the version it was decided on and changes no version. Applying is
idempotent, so at-least-once delivery is harmless: an event older than the ledger changes
nothing, one of the current version is applied only if its effect is not there yet; an event
more than one version ahead means events were missed and raises `LedgerGap`.

Versions for optimistic concurrency (see allocate.py for the commit rule): every GPU and every
node remembers the version of its last change (`Gpu.version`: its grants or state; `Node.version`:
anything on it), and every node the version its hardware last changed (`inventory_version`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Container, Iterable
from dataclasses import dataclass, field, replace
from typing import Literal, TypeVar

import msgspec

from ibpool_core.changes import ChangeLog
from ibpool_proto.pool import (
    AllocationExpired,
    AllocationKind,
    AllocationRejected,
    AllocationReleased,
    AllocationRevoked,
    MemberFailure,
)

from . import mig
from .enforcement import parse_mig_instance
from .messages import AllocationGranted, LeaseRenewed, LedgerEvent, PoolGpu, PoolNodeUpdated, QuotaChanged
from .quotas import Quota, QuotaKey, Share, usage_keys

WHOLE = 1000
NodeState = Literal["ready", "cordoned", "draining", "failed"]


class LedgerGap(ValueError):
    """An event more than one version ahead of the ledger: the events between were missed."""


class Gpu(msgspec.Struct, frozen=True, kw_only=True):
    index: int
    uuid: str
    model: str
    memory_mib: int
    mig_capable: bool = False
    nvlink_domain: str | None = None
    failed: bool = False
    cordoned: bool = False
    granted_milli: int = 0
    granted_memory_mib: int = 0
    mig: tuple[mig.MigInstance, ...] = ()
    holders: tuple[str, ...] = ()
    version: int = 0

    @property
    def ready(self) -> bool:
        return not self.failed and not self.cordoned

    @property
    def free_milli(self) -> int:
        return WHOLE - self.granted_milli

    @property
    def free_memory_mib(self) -> int:
        return self.memory_mib - self.granted_memory_mib

    def same_device(self, other: Gpu | PoolGpu) -> bool:
        """The same physical device, as far as the ledger can tell (state aside)."""
        return (self.index, self.uuid, self.model, self.memory_mib, self.mig_capable) == (
            other.index,
            other.uuid,
            other.model,
            other.memory_mib,
            other.mig_capable,
        )

    def fits_whole(self) -> bool:
        return self.granted_milli == 0 and self.granted_memory_mib == 0

    def fits_share(self, milli: int, memory_mib: int) -> bool:
        """A fraction fits: not partitioned, and enough compute and memory left."""
        return not self.mig and milli <= self.free_milli and memory_mib <= self.free_memory_mib

    def mig_start(self, profile: str) -> int | None:
        """Where one more instance of `profile` would go (lowest start), or None when it does not fit:
        the GPU is not MIG-capable, has no such profile, holds fractions or whole grants, or is full."""
        if not self.mig_capable or profile not in mig.MIG_PROFILES.get(self.model, {}):
            return None
        if not self.mig and not self.fits_whole():
            return None
        inst = mig.place(self.model, list(self.mig), profile)
        return None if inst is None else inst.start


class Node(msgspec.Struct, frozen=True, kw_only=True):
    node_id: str
    hostname: str = ""
    cpu_milli: int = 0
    memory_mib: int = 0
    gpus: tuple[Gpu, ...] = ()
    labels: dict[str, str] = {}
    api_url: str | None = None
    failed: bool = False
    cordoned: bool = False
    # A leaf cordon keeps multi-node work off the node only (see PoolNodeUpdated).
    leaf_cordoned: bool = False
    draining: bool = False
    granted_cpu_milli: int = 0
    granted_memory_mib: int = 0
    version: int = 0
    inventory_version: int = 0

    @property
    def state(self) -> NodeState:
        if self.failed:
            return "failed"
        if self.draining:
            return "draining"
        return "cordoned" if self.cordoned else "ready"

    @property
    def ready(self) -> bool:
        """Ready for single-node work (a leaf cordon does not concern it)."""
        return self.state == "ready"

    def ready_for(self, multi_node: bool) -> bool:
        """Ready for work that spans `multi_node` nodes or one."""
        return self.ready and not (multi_node and self.leaf_cordoned)

    @property
    def free_cpu_milli(self) -> int:
        return self.cpu_milli - self.granted_cpu_milli

    @property
    def free_memory_mib(self) -> int:
        return self.memory_mib - self.granted_memory_mib

    def gpu(self, index: int) -> Gpu | None:
        for g in self.gpus:
            if g.index == index:
                return g
        return None

    @property
    def holders(self) -> set[str]:
        """Ids of the allocations holding a share of one of its GPUs."""
        return {a for g in self.gpus for a in g.holders}


class GpuGrant(msgspec.Struct, frozen=True, kw_only=True):
    """The share of one GPU an allocation holds: compute (milli), memory, and the MIG instance if any."""

    node_id: str
    gpu_index: int
    model: str
    milli: int
    memory_mib: int
    mig: mig.MigInstance | None = None


class Allocation(msgspec.Struct, frozen=True, kw_only=True):
    allocation_id: str
    command_id: str
    job_id: str
    tenant: str
    queue: str
    kind: AllocationKind
    nodes: tuple[str, ...]
    grants: tuple[GpuGrant, ...]
    lease_expires_at: dt.datetime
    cpu_milli: int = 0
    host_memory_mib: int = 0
    client_node_id: str | None = None
    endpoint: str | None = None
    hops: int | None = None
    granted_version: int = 0
    on_member_failure: MemberFailure = "restart"

    @property
    def held_nodes(self) -> tuple[str, ...]:
        """The members that hold a share now, in rank order (a gang that declared `replace` may have
        lost one whose replacement is not granted yet)."""
        held = {g.node_id for g in self.grants}
        return tuple(n for n in self.nodes if n in held)

    @property
    def replaceable(self) -> bool:
        """A gang whose failed member is revoked alone (and replaced), not the whole gang."""
        return self.kind == "gang" and self.on_member_failure == "replace"

    @property
    def owner(self) -> str:
        """Who may renew its lease: the job it was granted to."""
        return self.job_id

    def share_by_model(self) -> dict[str, Share]:
        out: dict[str, Share] = {}
        for g in self.grants:
            out[g.model] = out.get(g.model, Share()) + Share(milli=g.milli, memory_mib=g.memory_mib)
        return out


# How many answers and end events of the past (of commands whose allocation is no longer held) a
# ledger keeps: enough for a repeated command (a client's retry, a redelivery) to get the same answer,
# but bounded. Kept forever, a long-running allocator and every replica held each grant ever made,
# and the garbage collector's full passes walked them all: 100 ms pauses in the scheduler after
# 12,000 jobs (docs/benchmarks.md). Replicas that never decide keep none (`past_kept=0`).
PAST_KEPT = 10_000
# Forgetting waits until this many more (at least) have piled up, so each pass is paid for by many events.
_FORGET_SLACK = 1_000

# The past is kept encoded (`Past`): bytes are not tracked by the garbage collector, and it is read
# only when a command comes again.
Past = dict[str, tuple[bytes, ...]]
_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(LedgerEvent).decode


@dataclass(eq=True)
class Ledger:
    version: int = 0
    past_kept: int = PAST_KEPT
    nodes: dict[str, Node] = field(default_factory=dict)
    allocations: dict[str, Allocation] = field(default_factory=dict)
    quotas: dict[QuotaKey, Quota] = field(default_factory=dict)
    usage: dict[QuotaKey, Share] = field(default_factory=dict)
    answers: Past = field(default_factory=dict)  # command id -> the events it was answered with
    ended: Past = field(default_factory=dict)  # allocation id -> the events that ended its parts
    removed_nodes: dict[str, int] = field(default_factory=dict)
    terms: dict[str, int] = field(default_factory=dict)

    def answer(self, command_id: str) -> tuple[LedgerEvent, ...]:
        """The events a command was answered with; () when none is remembered."""
        return tuple(_decode(e) for e in self.answers.get(command_id, ()))

    def ends(self, allocation_id: str) -> tuple[LedgerEvent, ...]:
        """The events that ended (parts of) an allocation; () when none is remembered."""
        return tuple(_decode(e) for e in self.ended.get(allocation_id, ()))

    def allocations_on(self, node_id: str) -> list[Allocation]:
        """Allocations holding a GPU of the node, in id order."""
        node = self.nodes.get(node_id)
        return [self.allocations[a] for a in sorted(node.holders)] if node else []


def node_changes(ledger: Ledger) -> ChangeLog:
    """The node ids whose `Node` the ledger replaced, added or removed, as it applies events: kept
    beside the ledger object (not part of its value: neither encoded nor compared; a copy or a
    decoded ledger starts a log of its own), for a reader that wants the nodes changed since it
    looked without comparing every node (`ChangeLog.changes_since`)."""
    log: ChangeLog | None = ledger.__dict__.get("_node_changes")
    if log is None:
        log = ledger.__dict__["_node_changes"] = ChangeLog()
    return log


def allocation_changes(ledger: Ledger) -> ChangeLog:
    """The allocation ids added, changed or removed, as `node_changes` for nodes."""
    log: ChangeLog | None = ledger.__dict__.get("_allocation_changes")
    if log is None:
        log = ledger.__dict__["_allocation_changes"] = ChangeLog()
    return log


# The format of `encode_ledger`'s bytes, stored with every snapshot. A change to the ledger's
# structs that older bytes would not decode to the same ledger (a field renamed, retyped or given a
# new meaning) raises it and brings a conversion from the older format; adding a field with a
# default does not (older bytes decode with the default).
LEDGER_FORMAT = 1


def check_format(found: int, what: str) -> None:
    """ValueError when `found` is not the `LEDGER_FORMAT` this code reads."""
    if found != LEDGER_FORMAT:
        raise ValueError(f"{what} is of ledger format {found}; this version reads format {LEDGER_FORMAT}")


class LedgerSnapshot(msgspec.Struct, frozen=True, kw_only=True):
    """The ledger as it stood at one version, for a reader that cannot replay from the first event
    (the pool stream keeps 30 days). `stream_seq`: the pool stream's sequence from which every
    event of a later version is found. The allocator reads the stream's last sequence before it
    takes the ledger: an event of a later version was committed, so published, after that read.
    Events of the snapshot's version or older met again after `stream_seq` change nothing (`apply`
    is idempotent). `ledger` is the encoded ledger (`encode_ledger`)."""

    version: int
    stream_seq: int
    ledger: bytes
    format: int = LEDGER_FORMAT  # of `ledger`; snapshots from before the field are format 1


_T = TypeVar("_T")
_ledger_decoder = msgspec.msgpack.Decoder(Ledger)
_snapshot_decoder = msgspec.msgpack.Decoder(LedgerSnapshot)


def encode_ledger(ledger: Ledger) -> bytes:
    return _encode(ledger)


def _decoded(decoder: msgspec.msgpack.Decoder[_T], data: bytes, what: str) -> _T:
    try:
        return decoder.decode(data)
    except msgspec.DecodeError as e:
        raise ValueError(f"not an encoded {what}: {e}") from None


def decode_ledger(data: bytes, past_kept: int | None = None) -> Ledger:
    """The ledger `encode_ledger` wrote; `past_kept` replaces the writer's. ValueError when `data` is not one."""
    ledger = _decoded(_ledger_decoder, data, "ledger")
    if past_kept is not None:
        ledger.past_kept = past_kept
    return ledger


def without_past(ledger: Ledger) -> Ledger:
    """The ledger as a replica keeps it (`past_kept=0`): of the past only the answers and ends of
    allocations held. A shallow copy sharing the nodes and allocations: encode it at once."""
    held = ledger.allocations
    commands = {a.command_id for a in held.values()}
    return replace(
        ledger,
        past_kept=0,
        answers={k: v for k, v in ledger.answers.items() if k in commands},
        ended={k: v for k, v in ledger.ended.items() if k in held},
    )


def encode_snapshot(snapshot: LedgerSnapshot) -> bytes:
    return _encode(snapshot)


def decode_snapshot(data: bytes) -> LedgerSnapshot:
    """ValueError when `data` is not an encoded LedgerSnapshot, or one of another ledger format."""
    snapshot = _decoded(_snapshot_decoder, data, "ledger snapshot")
    check_format(snapshot.format, f"the ledger snapshot of version {snapshot.version}")
    return snapshot


def rebuild(events: Iterable[LedgerEvent]) -> Ledger:
    """The ledger the event stream describes, replayed from an empty ledger."""
    ledger = Ledger()
    apply(ledger, events)
    return ledger


def apply(ledger: Ledger, events: Iterable[LedgerEvent]) -> None:
    """Apply events in order (see the module docstring for versions and duplicates)."""
    for event in events:
        match event:
            case AllocationGranted():
                _granted(ledger, event)
            case AllocationReleased() | AllocationRevoked() | AllocationExpired():
                _ended(ledger, event)
            case AllocationRejected():
                if _current(ledger, event.ledger_version):
                    ledger.answers[event.command_id] = (_encode(event),)
            case LeaseRenewed():
                _renewed(ledger, event)
            case PoolNodeUpdated():
                _node_updated(ledger, event)
            case QuotaChanged():
                if _advance(ledger, event.ledger_version):
                    if event.removed:
                        ledger.quotas.pop(event.quota.key, None)
                    else:
                        ledger.quotas[event.quota.key] = event.quota
                    if event.command_id:
                        ledger.answers[event.command_id] = (_encode(event),)
        _forget_the_past(ledger)


def _forget_the_past(ledger: Ledger) -> None:
    """Drop the oldest answers and end events beyond `past_kept`, never those of a held allocation.
    Called after every event, so the ledger is the same whether its events come one by one or all
    at once (`rebuild`)."""
    held = ledger.allocations
    most = len(held) + ledger.past_kept + max(ledger.past_kept, _FORGET_SLACK)
    if len(ledger.answers) > most:
        commands = {a.command_id for a in held.values()}
        _drop_oldest(ledger.answers, len(ledger.answers) - len(held) - ledger.past_kept, commands)
    if len(ledger.ended) > most:
        _drop_oldest(ledger.ended, len(ledger.ended) - len(held) - ledger.past_kept, held)


def _drop_oldest(entries: Past, n: int, keep: Container[str]) -> None:
    """Remove up to `n` of the first-inserted `entries` whose key is not in `keep`."""
    gone: list[str] = []
    for key in entries:
        if len(gone) >= n:
            break
        if key not in keep:
            gone.append(key)
    for key in gone:
        del entries[key]


def _advance(ledger: Ledger, version: int) -> bool:
    """Whether an event of `version` may still change the ledger; moves the ledger to it."""
    if version < ledger.version:
        return False
    if version > ledger.version + 1:
        raise LedgerGap(f"event of version {version} on a ledger at {ledger.version}: events were missed")
    ledger.version = version
    return True


def _current(ledger: Ledger, version: int) -> bool:
    """For events that change no version (rejections): whether it is news."""
    if version > ledger.version:
        raise LedgerGap(f"rejection decided at version {version} on a ledger at {ledger.version}")
    return version == ledger.version


def _granted(ledger: Ledger, ev: AllocationGranted) -> None:
    if not _advance(ledger, ev.ledger_version):
        return
    if ev.fencing_term is not None and ev.fencing_term > ledger.terms.get(ev.scheduler_group, 0):
        ledger.terms[ev.scheduler_group] = ev.fencing_term
    old = ledger.allocations.get(ev.allocation_id)
    if old is not None and any(g.node_id == ev.node_id for g in old.grants):
        return
    node = ledger.nodes.get(ev.node_id)
    if node is None:
        raise LedgerGap(f"grant {ev.allocation_id} on node {ev.node_id}, which the ledger does not know")
    instances = dict(parse_mig_instance(text) for text in ev.enforcement.mig_instances)
    grants = []
    for a in ev.assignments:
        gpu = node.gpu(a.gpu_index)
        if a.node_id != ev.node_id or gpu is None:
            continue
        memory = a.memory_mib if a.memory_mib is not None else gpu.memory_mib * a.milli // WHOLE
        grants.append(
            GpuGrant(
                node_id=ev.node_id,
                gpu_index=a.gpu_index,
                model=gpu.model,
                milli=a.milli,
                memory_mib=memory,
                mig=instances.get(a.gpu_index),
            )
        )
    if old is None:
        alloc = Allocation(
            allocation_id=ev.allocation_id,
            command_id=ev.command_id or ev.allocation_id,
            job_id=ev.job_id,
            tenant=ev.tenant,
            queue=ev.queue,
            kind=ev.kind,
            nodes=tuple(ev.nodes or [ev.node_id]),  # rank order
            grants=_sorted_grants(grants),
            lease_expires_at=ev.lease_expires_at,
            cpu_milli=ev.cpu_milli,
            host_memory_mib=ev.host_memory_mib,
            client_node_id=ev.client_node_id,
            endpoint=ev.endpoint,
            hops=ev.hops,
            granted_version=ev.ledger_version,
            on_member_failure=ev.on_member_failure,
        )
    elif ev.replaces is not None:
        # A replaced gang member: the new node takes the replaced one's rank (`nodes` in rank order).
        alloc = msgspec.structs.replace(
            old, grants=_sorted_grants([*old.grants, *grants]), nodes=tuple(ev.nodes or old.nodes)
        )
    else:
        alloc = msgspec.structs.replace(old, grants=_sorted_grants([*old.grants, *grants]))
    ledger.allocations[alloc.allocation_id] = alloc
    allocation_changes(ledger).note(alloc.allocation_id, len(ledger.allocations))
    _hold(ledger, alloc, grants, ev.ledger_version, +1)
    key = ev.command_id if ev.replaces is not None and ev.command_id else alloc.command_id
    ledger.answers[key] = (*ledger.answers.get(key, ()), _encode(ev))


def _ended(ledger: Ledger, ev: AllocationReleased | AllocationRevoked | AllocationExpired) -> None:
    if not _advance(ledger, ev.ledger_version):
        return
    alloc = ledger.allocations.get(ev.allocation_id)
    if alloc is None:
        return
    part = [g for g in alloc.grants if g.node_id == ev.node_id]
    if not part:
        return
    rest = tuple(g for g in alloc.grants if g.node_id != ev.node_id)
    if rest:
        ledger.allocations[alloc.allocation_id] = msgspec.structs.replace(alloc, grants=rest)
    else:
        del ledger.allocations[alloc.allocation_id]
    allocation_changes(ledger).note(alloc.allocation_id, len(ledger.allocations))
    _hold(ledger, alloc, part, ev.ledger_version, -1)
    ledger.ended[alloc.allocation_id] = (*ledger.ended.get(alloc.allocation_id, ()), _encode(ev))


def _hold(ledger: Ledger, alloc: Allocation, grants: list[GpuGrant], version: int, sign: int) -> None:
    """Add (sign +1) or remove (-1) one node's part of an allocation to its GPUs, host and usage."""
    if not grants:
        return
    node = ledger.nodes[grants[0].node_id]
    by_index = {g.gpu_index: g for g in grants}
    gpus = []
    for gpu in node.gpus:
        g = by_index.get(gpu.index)
        if g is None:
            gpus.append(gpu)
            continue
        if sign > 0:
            layout = (*gpu.mig, g.mig) if g.mig is not None else gpu.mig
            holders = tuple(sorted({*gpu.holders, alloc.allocation_id}))
        else:
            layout = tuple(i for i in gpu.mig if i != g.mig)
            holders = tuple(h for h in gpu.holders if h != alloc.allocation_id)
        gpus.append(
            msgspec.structs.replace(
                gpu,
                granted_milli=gpu.granted_milli + sign * g.milli,
                granted_memory_mib=gpu.granted_memory_mib + sign * g.memory_mib,
                mig=tuple(sorted(layout, key=lambda i: i.start)),
                holders=holders,
                version=version,
            )
        )
    ledger.nodes[node.node_id] = msgspec.structs.replace(
        node,
        gpus=tuple(gpus),
        granted_cpu_milli=node.granted_cpu_milli + sign * alloc.cpu_milli,
        granted_memory_mib=node.granted_memory_mib + sign * alloc.host_memory_mib,
        version=version,
    )
    node_changes(ledger).note(node.node_id, len(ledger.nodes))
    for g in grants:
        for key in usage_keys(alloc.tenant, alloc.queue, g.model):
            share = Share(milli=g.milli, memory_mib=g.memory_mib)
            total = ledger.usage.get(key, Share()) + (share if sign > 0 else Share() - share)
            if total.is_zero:
                ledger.usage.pop(key, None)
            else:
                ledger.usage[key] = total


def _renewed(ledger: Ledger, ev: LeaseRenewed) -> None:
    if not _advance(ledger, ev.ledger_version):
        return
    alloc = ledger.allocations.get(ev.allocation_id)
    if alloc is not None:
        ledger.allocations[alloc.allocation_id] = msgspec.structs.replace(alloc, lease_expires_at=ev.lease_expires_at)
        allocation_changes(ledger).note(alloc.allocation_id, len(ledger.allocations))
    if ev.command_id:
        ledger.answers[ev.command_id] = (_encode(ev),)


def _node_updated(ledger: Ledger, ev: PoolNodeUpdated) -> None:
    if not _advance(ledger, ev.ledger_version):
        return
    v = ev.ledger_version
    old = ledger.nodes.get(ev.node_id)
    node_changes(ledger).note(ev.node_id, len(ledger.nodes))
    if ev.removed:
        ledger.nodes.pop(ev.node_id, None)
        ledger.removed_nodes[ev.node_id] = v
        return
    gpus = []
    for pg in sorted(ev.gpus, key=lambda g: g.index):
        prev = old.gpu(pg.index) if old else None
        if prev is not None and prev.same_device(pg):
            moved = (prev.failed, prev.cordoned, prev.nvlink_domain) != (pg.failed, pg.cordoned, pg.nvlink_domain)
            gpus.append(
                msgspec.structs.replace(
                    prev,
                    failed=pg.failed,
                    cordoned=pg.cordoned,
                    nvlink_domain=pg.nvlink_domain,
                    version=v if moved else prev.version,
                )
            )
        else:
            gpus.append(
                Gpu(
                    index=pg.index,
                    uuid=pg.uuid,
                    model=pg.model,
                    memory_mib=pg.memory_mib,
                    mig_capable=pg.mig_capable,
                    nvlink_domain=pg.nvlink_domain,
                    failed=pg.failed,
                    cordoned=pg.cordoned,
                    version=v,
                )
            )
    same_hardware = old is not None and _hardware(old) == (ev.cpu_milli, ev.memory_mib, _devices(ev.gpus))
    ledger.nodes[ev.node_id] = Node(
        node_id=ev.node_id,
        hostname=ev.hostname,
        cpu_milli=ev.cpu_milli,
        memory_mib=ev.memory_mib,
        gpus=tuple(gpus),
        labels=dict(ev.labels),
        api_url=ev.api_url,
        failed=ev.failed,
        cordoned=ev.cordoned,
        leaf_cordoned=ev.leaf_cordoned,
        draining=ev.draining,
        granted_cpu_milli=old.granted_cpu_milli if old else 0,
        granted_memory_mib=old.granted_memory_mib if old else 0,
        version=v,
        inventory_version=old.inventory_version if old is not None and same_hardware else v,
    )
    ledger.removed_nodes.pop(ev.node_id, None)


def _devices(gpus: Iterable[Gpu | PoolGpu]) -> list[tuple[int, str, str, int, bool]]:
    return sorted((g.index, g.uuid, g.model, g.memory_mib, g.mig_capable) for g in gpus)


def _hardware(node: Node) -> tuple[int, int, list[tuple[int, str, str, int, bool]]]:
    return (node.cpu_milli, node.memory_mib, _devices(node.gpus))


def _sorted_grants(grants: Iterable[GpuGrant]) -> tuple[GpuGrant, ...]:
    return tuple(sorted(grants, key=lambda g: (g.node_id, g.gpu_index)))


def pool_gpus(node: Node) -> list[PoolGpu]:
    """The node's GPUs as a `PoolNodeUpdated` event lists them."""
    return [
        PoolGpu(
            index=g.index,
            uuid=g.uuid,
            model=g.model,
            memory_mib=g.memory_mib,
            mig_capable=g.mig_capable,
            nvlink_domain=g.nvlink_domain,
            failed=g.failed,
            cordoned=g.cordoned,
        )
        for g in node.gpus
    ]
