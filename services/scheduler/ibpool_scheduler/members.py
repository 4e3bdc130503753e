"""Replacing the failed member of a gang that declared `on_member_failure: replace`: the cycle's part.

A gang of such a job keeps its allocation id when one member is lost: the allocator revokes that
member's share alone (a node or GPU failure), and the scheduler asks for a new host in its place
with `ReplaceGangMember`; the other members keep running and get no event. What the news does to
the job (the member marked `replacing`, the new member's grant, a refusal, a restart) is the core's
`ibpool_core.sched.lifecycle`; here the leader's cycle chooses the new host and proposes it:

    the next cycle (leader, fenced)  -> `propose_replacements`: a host chosen by `choose_host`;
                                        ReplaceGangMember out, or no host fits: the gang restarts

The replacement waits for the failover controller's backoff (`retry_after_s` of its
RequeueRequested, as the job's `not_before`). `choose_host` is pure; `propose_replacements` reads
and writes the job rows in the cycle's transaction.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

import msgspec

from ibpool_core.pool.ledger import Ledger
from ibpool_core.sched import lifecycle
from ibpool_core.sched import records as jobs
from ibpool_core.sched.jobs import Job
from ibpool_core.sched.placer import FreeView, LeafPlacer
from ibpool_core.sched.records import JobPlacement, JobRecord
from ibpool_proto.pool import GpuAssignment, ReplaceGangMember
from ibpool_runtime.logs import get_logger
from ibpool_runtime.store import Transaction

from . import state
from .plan import LeafSource, host_view

if TYPE_CHECKING:
    from .service import Scheduler

log = get_logger(__name__)

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
            await sched.apply(tx, lifecycle.restart(job, why, now, sched.lifecycle), job.job_id)
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
