"""Replacing the failed member of a gang that declared `on_member_failure: replace`.

A gang of such a job keeps its allocation id when one member is lost: the allocator revokes that
member's share alone (a node or GPU failure), and the scheduler asks for a new host in its place
with `ReplaceGangMember`; the other members keep running and get no event. Otherwise (a
`restart` gang, a single-host job) the job is requeued whole, as `Scheduler.on_lost` does.

    lost member (AllocationRevoked of one node, RequeueRequested naming the node, or a member's
    exit for a hardware reason)      -> `member_lost`: the job records `replacing` (no release)
    the next cycle (leader, fenced)  -> `propose_replacements`: a host chosen by `choose_host`;
                                        ReplaceGangMember out, or no host fits: the gang restarts
    AllocationGranted(replaces=...)  -> `on_granted`: the new host takes the lost member's rank
    AllocationRejected of it         -> `on_rejected`: conflict/stale retried at once (a few
                                        times), anything else restarts the gang

A second member lost while one is being replaced, or more replacements than `max_attempts`, restart
the gang. The replacement waits for the failover controller's backoff (`retry_after_s` of its
RequeueRequested, as the job's `not_before`) when that arrives before the replacement is proposed,
also after the revocation that marked the member; a replacement already proposed goes on (the
controller's verdict and the allocator's revocation come on different streams, in either order).
`choose_host` is pure; the rest reads and writes the job rows in the caller's transaction.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

import msgspec

from ibpool_core.pool.ledger import Ledger
from ibpool_core.sched.jobs import Job
from ibpool_core.sched.placer import FreeView, LeafPlacer
from ibpool_proto.job import JobExited
from ibpool_proto.pool import AllocationGranted, AllocationRejected, GpuAssignment, ReplaceGangMember
from ibpool_runtime.logs import get_logger
from ibpool_runtime.store import Transaction

from . import jobs, state
from .jobs import JobPlacement, JobRecord
from .plan import LeafSource, host_view

if TYPE_CHECKING:
    from .service import Scheduler

log = get_logger(__name__)

# Exit reasons of a member that mean its hardware, not its program, failed: the member is replaced.
HARDWARE_EXITS = ("xid", "lost")
# A replacement refused for `conflict` or `stale` is tried again at once this many times, then the gang restarts.
MAX_REPLACE_RETRIES = 3
RETRY_AT_ONCE = ("conflict", "stale")


def replaceable(job: JobRecord) -> bool:
    return job.on_member_failure == "replace" and job.hosts > 1


def choose_host(
    ledger: Ledger,
    job: JobRecord,
    failed: str,
    taken: Mapping[str, Iterable[int]],
    leaves: LeafSource,
    site_label: str = "ibpool.io/site",
) -> list[GpuAssignment] | str:
    """The new host's GPUs for the member of `job` lost on `failed`, or why no host fits.

    Candidates: ready nodes outside the gang with `gpus_per_host` whole GPUs free (of the job's GPU
    model, if it names one), none of them in `taken`, at the job's site when it is bound to one.
    Leaf groups are those of `leaves` (the published fabric's, else the node labels'). The topology
    constraint: the leaf groups its other members are under come first (it spans no more than it
    did); then, for `required` on a published fabric, the rest of the switch group of its tier that
    holds them (never wider); for `preferred`, anywhere. Among the allowed hosts the core's
    `LeafPlacer` takes the best fit (the fewest free GPUs that still hold the member), keeping whole
    hosts free.
    """
    held = {n: set(g) for n, g in taken.items()}
    view = host_view(ledger, held, leaves)
    members = set(job.nodes) | {failed}
    need = job.gpus_per_host
    free: list[list[int]] = []
    for node_id, gpus in zip(view.node_ids, view.free_gpus, strict=True):
        node = ledger.nodes[node_id]
        ok = [i for i in gpus if job.gpu_model is None or ((g := node.gpu(i)) is not None and g.model == job.gpu_model)]
        elsewhere = job.site is not None and node.labels.get(site_label, "") != job.site
        free.append(ok if node_id not in members and not elsewhere else [])
    survivors = [n for n in job.nodes if n != failed and n in ledger.nodes]
    spanned = {leaves.leaf(ledger.nodes[n]) for n in survivors}
    leaf_names = {h: leaves.leaf(ledger.nodes[n]) for h, n in enumerate(view.node_ids)}
    # The hosts each try allows (None: any): the gang's own leaf groups, then its tier's group or anywhere.
    tries: list[set[str] | None] = [
        {n for h, n in enumerate(view.node_ids) if leaf_names[h] in spanned} if spanned else None
    ]
    if job.topology == "required":
        fabric = leaves.fabric
        if fabric is not None and survivors and survivors[0] in fabric.leaf_of:
            level = min(job.topology_level, fabric.index.levels)
            group = fabric.index.subtree_of(survivors[0], level)
            tries.append(set(group.hosts) if group is not None else set())
    else:
        tries.append(None)
    one = Job(id=job.job_id, tenant=job.tenant, gpus=need, nodes=1, submit_time=job.submitted_at.timestamp())
    for allowed in tries:
        counts = [
            len(f) if len(f) >= need and (allowed is None or view.node_ids[h] in allowed) else 0
            for h, f in enumerate(free)
        ]
        if not any(counts):
            continue
        placed = LeafPlacer().place(FreeView(counts, view.cluster.leaf_of, max(counts)), one, None)
        if placed:
            host, _ = placed[0]
            return [GpuAssignment(node_id=view.node_ids[host], gpu_index=i) for i in sorted(free[host])[:need]]
    model = f" of model {job.gpu_model}" if job.gpu_model else ""
    where = ""
    if job.topology == "required":
        unit = "the leaves" if leaves.fabric is None else f"the tier-{job.topology_level} switch group"
        where = f" under {unit} of its other members (topology required)"
    where += f" at site {job.site}" if job.site is not None else ""
    return f"no ready host outside the gang has {need} free GPUs{model}{where}"


def sharp_after_replacement(ledger: Ledger, job: JobRecord, new_host: str, leaves: LeafSource) -> JobPlacement | None:
    """The job's placement once `new_host` replaces a member: SHARP stays on (and its NCCL settings go
    to the new member) only when the new host is under a leaf the gang already spans, so the gang's
    covering subtree, the one found SHARP-capable, is unchanged; otherwise it is off for the job."""
    placement = job.placement
    if placement is None or not placement.sharp:
        return placement
    spanned = {leaves.leaf(ledger.nodes[n]) for n in job.nodes if n in ledger.nodes}
    node = ledger.nodes.get(new_host)
    if node is not None and leaves.leaf(node) in spanned:
        return placement
    return msgspec.structs.replace(
        placement,
        sharp=False,
        sharp_reason=f"off since {new_host} replaced a member outside the leaves of the SHARP-capable subtree",
        nccl_env={},
    )


async def member_lost(
    sched: Scheduler,
    tx: Transaction,
    job: JobRecord,
    node_id: str,
    why: str,
    now: dt.datetime,
    not_before: dt.datetime | None = None,
) -> None:
    """`job` (locked, holding, replaceable) lost its member on `node_id`: mark it for replacement, to be
    proposed not before `not_before` (the failover controller's backoff for a job that keeps landing
    on failing hardware)."""
    if job.replacing == node_id and job.replace_id is None and _later(not_before, job.not_before):
        # The controller's backoff came after the revocation that marked the member: wait for it too.
        reason = _replacing(node_id, not_before, why)
        await state.save_job(tx, msgspec.structs.replace(job, not_before=not_before, reason=reason), now)
        return
    if node_id not in job.nodes or job.replacing == node_id:
        return  # a member replaced already (the old member's late news), or being replaced
    assert job.allocation_id is not None
    if job.replacing is not None:
        await sched.on_lost(
            tx,
            job.job_id,
            job.allocation_id,
            f"member on {node_id} lost while the member on {job.replacing} was being replaced: gang restarted; {why}",
            not_before,
        )
        return
    ranked = job.placement.hosts if job.placement is not None and job.placement.hosts else job.nodes
    if ranked and node_id == ranked[0]:
        # Rank 0 is the gang's rendezvous (MASTER_ADDR in every member's environment): the survivors
        # would keep pointing at the lost host, so the whole gang starts again.
        await sched.on_lost(
            tx, job.job_id, job.allocation_id, f"member of rank 0 on {node_id} lost: gang restarted; {why}", not_before
        )
        return
    if job.replacements >= sched.cfg.max_attempts:
        await sched.on_lost(
            tx,
            job.job_id,
            job.allocation_id,
            f"{job.replacements} members replaced already: gang restarted; {why}",
            not_before,
        )
        return
    marked = msgspec.structs.replace(
        job,
        replacing=node_id,
        replace_id=None,
        replace_proposal=[],
        replace_retries=0,
        exited_nodes=[n for n in job.exited_nodes if n != node_id],
        not_before=not_before,
        reason=_replacing(node_id, not_before, why),
    )
    await state.save_job(tx, marked, now)
    sched.requeues.labels("member replacement").inc()
    log.info("gang member lost; replacing it", job_id=job.job_id, node_id=node_id, why=why)
    sched.wake_after(tx)


async def on_member_exit(sched: Scheduler, tx: Transaction, job: JobRecord, ev: JobExited, now: dt.datetime) -> bool:
    """A member's exit, for a replaceable gang: True when handled here (the old member of a replaced
    node, or a hardware exit: the member is replaced), False to handle it as any job's exit."""
    if ev.node_id not in job.nodes:
        return True  # the member replaced already: its end is not the job's
    if ev.reason in HARDWARE_EXITS:
        detail = f"{ev.reason} on {ev.node_id}: {ev.detail}".rstrip(": ")
        await member_lost(sched, tx, job, ev.node_id, f"member exited ({detail})", now)
        return True
    return False


def _replacing(node_id: str, not_before: dt.datetime | None, why: str) -> str:
    """The reason of a job whose member on `node_id` is to be replaced (ReplaceGangMember carries it)."""
    after = f" not before {not_before.isoformat(timespec='seconds')}" if not_before is not None else ""
    return f"replacing the member on {node_id}{after}: {why}"


def _later(a: dt.datetime | None, b: dt.datetime | None) -> bool:
    return a is not None and (b is None or a > b)


def replacements_due(live: Iterable[JobRecord], now: dt.datetime) -> list[JobRecord]:
    """The held jobs with a member to replace, none proposed yet, and their backoff (if any) over."""
    return [j for j in live if j.member_to_replace and (j.not_before is None or j.not_before <= now)]


async def propose_replacements(
    sched: Scheduler,
    tx: Transaction,
    ledger: Ledger,
    proposed: Iterable[GpuAssignment],
    term: int | None,
    now: dt.datetime,
) -> bool:
    """In the cycle (the leader, fenced): a ReplaceGangMember for every job of the cycle's live
    jobs (`sched.live`) with a member to replace and none in flight, or the gang restarted when no
    host fits. `proposed`: the GPUs this cycle's proposals take (the replacements already in flight
    are among the live jobs' GPUs in flight). Whether any job had a member to replace."""
    waiting = replacements_due(sched.live.replacing(), now)
    if not waiting:
        return False
    taken: dict[str, set[int]] = {n: set(g) for n, g in sched.live.in_flight(ledger).items()}
    for a in proposed:
        taken.setdefault(a.node_id, set()).add(a.gpu_index)
    for job in waiting:
        locked = await state.lock_job(tx, job.job_id)
        if locked != job:
            continue  # changed since the cycle read it: the next cycle looks again
        assert job.replacing is not None and job.allocation_id is not None
        leaves = sched.leaf_source()
        choice = choose_host(ledger, job, job.replacing, taken, leaves, sched.cfg.site_label)
        if isinstance(choice, str):
            why = f"member on {job.replacing} lost and no host fits its replacement ({choice}): gang restarted"
            await sched.on_lost(tx, job.job_id, job.allocation_id, why)
            continue
        placement = sharp_after_replacement(ledger, job, choice[0].node_id, leaves)
        cmd = ReplaceGangMember(
            source=sched.kit.source,
            key=job.allocation_id,
            allocation_id=job.allocation_id,
            job_id=job.job_id,
            failed_node_id=job.replacing,
            assignments=choice,
            ledger_version=ledger.version,
            workload=jobs.workload_with_env(job.workload, placement.nccl_env if placement else {}),
            reason=job.reason,
            scheduler_group=sched.group,
            fencing_term=term,
        )
        for a in choice:
            taken.setdefault(a.node_id, set()).add(a.gpu_index)
        replaced = msgspec.structs.replace(job, replace_id=cmd.id, replace_proposal=choice, placement=placement)
        await state.save_job(tx, replaced, now)
        await tx.outbox(cmd)
        log.info("gang member replacement proposed", job_id=job.job_id, failed=job.replacing, host=choice[0].node_id)
    return True


async def on_granted(
    sched: Scheduler, tx: Transaction, job: JobRecord, ev: AllocationGranted, now: dt.datetime
) -> None:
    """The grant of a replaced member (`ev.replaces` set): the new host takes the lost one's rank."""
    if not (job.holding and job.allocation_id == ev.allocation_id):
        # Not the job's allocation any more (it restarted meanwhile): give the allocation back.
        await tx.outbox(
            sched.release(ev.allocation_id, f"job {job.job_id} does not hold allocation {ev.allocation_id}")
        )
        return
    if job.replace_id != ev.command_id or job.replacing != ev.replaces:
        return  # a repeated grant, answered already
    lost, new = ev.replaces, ev.node_id
    nodes = list(ev.nodes) or [new if n == lost else n for n in job.nodes]
    rank = {n: i for i, n in enumerate(nodes)}
    assignments = sorted(
        [*(a for a in job.assignments if a.node_id != lost), *ev.assignments],
        key=lambda a: (rank.get(a.node_id, len(rank)), a.gpu_index),
    )
    placement = job.placement
    if placement is not None:
        placement = msgspec.structs.replace(placement, hosts=[new if h == lost else h for h in placement.hosts])
    done = msgspec.structs.replace(
        job,
        nodes=nodes,
        assignments=assignments,
        placement=placement or JobPlacement(hosts=nodes),
        replacing=None,
        replace_id=None,
        replace_proposal=[],
        replace_retries=0,
        replacements=job.replacements + 1,
        not_before=None,
        exited_nodes=[n for n in job.exited_nodes if n != lost],
        reason=f"member on {lost} replaced by {new}",
    )
    await state.save_job(tx, done, now)
    sched.answers.labels("member replaced").inc()
    log.info("gang member replaced", job_id=job.job_id, lost=lost, new=new, allocation_id=ev.allocation_id)


async def on_rejected(
    sched: Scheduler, tx: Transaction, job: JobRecord, ev: AllocationRejected, now: dt.datetime
) -> None:
    """The allocator refused the replacement: try again at once on fresher state (conflict, stale, a
    few times), else restart the gang with the reason."""
    assert job.allocation_id is not None and job.replacing is not None
    sched.answers.labels(f"replacement {ev.reason}").inc()
    if ev.reason in RETRY_AT_ONCE and job.replace_retries < MAX_REPLACE_RETRIES:
        again = msgspec.structs.replace(
            job,
            replace_id=None,
            replace_proposal=[],
            replace_retries=job.replace_retries + 1,
            reason=f"replacing the member on {job.replacing}: refused ({ev.reason}: {ev.detail}), trying again",
        )
        await state.save_job(tx, again, now)
        sched.wake_after(tx)
        return
    why = f"replacement of the member on {job.replacing} refused ({ev.reason}: {ev.detail}): gang restarted"
    await sched.on_lost(tx, job.job_id, job.allocation_id, why)
