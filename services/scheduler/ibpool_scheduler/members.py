"""Replacing the failed member of a gang that declared `on_member_failure: replace`: the cycle's part.

A gang of such a job keeps its allocation id when one member is lost: the allocator revokes that
member's share alone (a node or GPU failure), and the scheduler asks for a new host in its place
with `ReplaceGangMember`; the other members keep running and get no event. What the news does to
the job (the member marked `replacing`, the new member's grant, a refusal, a restart) is the core's
`ibpool_core.sched.lifecycle`, the new host is the core's `ibpool_core.sched.members.choose_host`;
here the leader's cycle proposes it:

    the next cycle (leader, fenced)  -> `propose_replacements`: a host chosen by `choose_host`;
                                        ReplaceGangMember out, or no host fits: the gang restarts

The replacement waits for the failover controller's backoff (`retry_after_s` of its
RequeueRequested, as the job's `not_before`). `propose_replacements` reads and writes the job rows
in the cycle's transaction.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from typing import TYPE_CHECKING

import msgspec

from ibpool_core.pool.ledger import Ledger
from ibpool_core.sched import lifecycle
from ibpool_core.sched import records as jobs
from ibpool_core.sched.members import choose_host, replacements_due, sharp_after_replacement
from ibpool_proto.pool import GpuAssignment, ReplaceGangMember
from ibpool_runtime.logs import get_logger
from ibpool_runtime.store import Transaction

from . import state

if TYPE_CHECKING:
    from .service import Scheduler

log = get_logger(__name__)


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
