"""Replacing the lost member of a gang that declared `on_member_failure: replace`: the choice. Pure.

`choose_host` picks the new host's GPUs (or says why none fits) and `sharp_after_replacement` what
becomes of the gang's SHARP placement; the scheduler service's cycle calls them for every job
`replacements_due` returns and proposes the result (`ibpool_scheduler.members`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping

import msgspec

from ibpool_core.pool.ledger import Ledger
from ibpool_core.sched.jobs import Job
from ibpool_core.sched.placer import FreeView, LeafPlacer
from ibpool_core.sched.pool_cycle import LeafSource, host_view
from ibpool_core.sched.records import JobPlacement, JobRecord
from ibpool_proto.pool import GpuAssignment


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
    one = Job(id=job.job_id, tenant=job.tenant, gpus=need, hosts=1, submit_time=job.submitted_at.timestamp())
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
