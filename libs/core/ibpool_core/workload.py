"""What a node agent does with grants: start, refuse, finish and stop workloads. Pure.

The agent's service feeds these functions the grant, what already runs and the time; it stores
the returned workload and publishes the returned events. The simulated launcher's work ends
after the grant's `simulated_runtime_s`; work whose simulated memory exceeds the grant's memory
limit is killed as OOM, which is how the simulated agent enforces fractional grants.

Event ids derive from what caused the event (`ibpool_core.ids.event_id`), never drawn at random:
JobStarted and a refusal's JobExited (their v2, keyed by node) from the grant (`<grant id>/started`,
`<grant id>/refused`), a stop from the news that ended the allocation (`<its id>/stopped/<node>`), a
workload's own end from the workload (`<allocation>/<node>/<started at>/exited`). The same input
gives the same event, so a redelivered grant or a repeated tick publishes what JetStream's
duplicate window drops.
"""

from __future__ import annotations

import datetime as dt
import signal
from collections.abc import Sequence

import msgspec

from ibpool_proto.job import ExitReason, JobExited, JobExitedV2, JobStarted, JobStartedV2
from ibpool_proto.pool import AllocationExpired, AllocationGranted, AllocationReleased, AllocationRevoked

from .ids import event_id

OOM_EXIT_CODE = 137  # what a kernel OOM kill looks like from the parent: 128 + SIGKILL
REVOKED_EXIT_CODE = 143  # 128 + SIGTERM
SECONDS_TO_OOM = 0.5  # simulated work reaches its memory peak this fast


class Workload(msgspec.Struct, frozen=True, kw_only=True):
    allocation_id: str
    job_id: str
    node_id: str
    gpu_indices: list[int]
    started_at: dt.datetime
    ends_at: dt.datetime | None
    planned_exit: ExitReason = "completed"
    memory_limit_mib: int | None = None
    memory_demand_mib: int | None = None
    env: dict[str, str] = {}
    # The MIG instances created for it ("<gpu index>:<profile>@<start>"), re-applied after an agent restart.
    mig_instances: list[str] = []
    # "simulated" (ends at `ends_at`) or "process" (a real command; ends when the process does).
    launcher: str = "simulated"
    command: list[str] = []
    pid: int | None = None
    # Whole GPUs (False: a fraction or MIG instance, which may share its GPU with other work).
    whole: bool = True


class GrantAdmitted(msgspec.Struct, frozen=True, kw_only=True):
    workload: Workload
    started: JobStarted


class GrantIgnored(msgspec.Struct, frozen=True, kw_only=True):
    """Nothing to do: a repeat of a grant already running, or not for a node hosted here."""

    reason: str


class GrantRefused(msgspec.Struct, frozen=True, kw_only=True):
    """The grant cannot be honoured on this node; the job exits at once with the reason."""

    exited: JobExited


GrantDecision = GrantAdmitted | GrantIgnored | GrantRefused


def forged_grant(grant: AllocationGranted, running: Sequence[Workload], now: dt.datetime) -> str | None:
    """Why a signed grant must still not run here, or None: it is past its lease (a replay of an old
    grant), or it gives GPUs that work running here holds under another allocation whole (a grant
    that contradicts what this node runs). Fractions and MIG instances share GPUs, so only a whole
    GPU (milli 1000) on either side is a conflict."""
    if grant.lease_expires_at <= now:
        return f"its lease ended at {grant.lease_expires_at.isoformat(timespec='seconds')} (a replay)"
    held = {
        g: w.allocation_id
        for w in running
        if w.allocation_id != grant.allocation_id and w.node_id == grant.node_id and w.whole
        for g in w.gpu_indices
    }
    shared = {
        g: w.allocation_id
        for w in running
        if w.allocation_id != grant.allocation_id and w.node_id == grant.node_id
        for g in w.gpu_indices
    }
    for a in grant.assignments:
        if a.node_id != grant.node_id:
            continue
        other = held.get(a.gpu_index) or (shared.get(a.gpu_index) if a.milli >= 1000 else None)
        if other is not None:
            return f"GPU {a.gpu_index} of {grant.node_id} runs allocation {other}"
    return None


def admit_grant(
    grant: AllocationGranted,
    *,
    hosted_nodes: dict[str, int],
    running: set[str],
    now: dt.datetime,
    source: str,
    default_runtime_s: float,
    allow_commands: bool = False,
) -> GrantDecision:
    """Decide what a grant means here. `hosted_nodes` maps node id -> GPU count.

    A grant whose workload names a command runs it as a process, where the agent allows commands
    (running what arrives on the bus is an operator's choice); otherwise it is refused.
    """
    if grant.node_id not in hosted_nodes:
        return GrantIgnored(reason=f"node {grant.node_id} is not hosted by this agent")
    if grant.allocation_id in running:
        return GrantIgnored(reason=f"allocation {grant.allocation_id} already runs")
    gpu_count = hosted_nodes[grant.node_id]
    indices = sorted({a.gpu_index for a in grant.assignments if a.node_id == grant.node_id})
    whole = all(a.milli >= 1000 and a.mig_profile is None for a in grant.assignments if a.node_id == grant.node_id)
    bad = [i for i in indices if not 0 <= i < gpu_count]
    if not indices or bad:
        detail = f"GPU indices {bad} do not exist (node has {gpu_count})" if bad else "grant assigns no GPU here"
        return GrantRefused(exited=refuse_grant(grant, now=now, source=source, detail=detail))
    spec = grant.workload
    if spec is not None and spec.command:
        if not allow_commands:
            detail = "this agent does not run commands (allow_commands is off)"
            return GrantRefused(exited=refuse_grant(grant, now=now, source=source, detail=detail))
        process = Workload(
            allocation_id=grant.allocation_id,
            job_id=grant.job_id,
            node_id=grant.node_id,
            gpu_indices=indices,
            started_at=now,
            ends_at=None,
            memory_limit_mib=grant.enforcement.memory_limit_mib,
            env=dict(grant.enforcement.env),
            launcher="process",
            command=list(spec.command),
            whole=whole,
        )
        return GrantAdmitted(workload=process, started=_started(process, grant, source))
    runtime_s = spec.simulated_runtime_s if spec and spec.simulated_runtime_s is not None else default_runtime_s
    limit = grant.enforcement.memory_limit_mib
    demand = spec.simulated_memory_mib if spec else None
    planned: ExitReason = "completed"
    if limit is not None and demand is not None and demand > limit:
        planned, runtime_s = "oom", min(runtime_s, SECONDS_TO_OOM)
    workload = Workload(
        allocation_id=grant.allocation_id,
        job_id=grant.job_id,
        node_id=grant.node_id,
        gpu_indices=indices,
        started_at=now,
        ends_at=now + dt.timedelta(seconds=runtime_s),
        planned_exit=planned,
        memory_limit_mib=limit,
        memory_demand_mib=demand,
        env=dict(grant.enforcement.env),
        whole=whole,
    )
    return GrantAdmitted(workload=workload, started=_started(workload, grant, source))


def _started(w: Workload, grant: AllocationGranted, source: str) -> JobStarted:
    return JobStartedV2(
        id=event_id(w.started_at, f"{grant.id}/started", 0),
        source=source,
        key=w.node_id,
        occurred_at=w.started_at,
        job_id=w.job_id,
        allocation_id=w.allocation_id,
        node_id=w.node_id,
        launcher=w.launcher,
        pid=w.pid,
    )


def process_exited(
    w: Workload, returncode: int | None, *, now: dt.datetime, source: str, xids: Sequence[int] = ()
) -> JobExited:
    """The exit of a workload's process. `returncode` as asyncio reports it (-N: killed by signal N;
    None: unknown, the agent restarted while it ran); `xids` the XID codes its GPUs raised meanwhile,
    which make a failure an "xid" exit."""
    cause = _end_of(w)
    if returncode is None:
        return _exited(w, now, source, -1, "lost", "exit code unknown: the agent restarted while it ran", cause)
    if returncode == 0:
        return _exited(w, now, source, 0, "completed", "", cause)
    seen = f"; XID {', '.join(map(str, xids))} on its GPUs" if xids else ""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        code = 128 - returncode  # as a shell reports it
        return _exited(w, now, source, code, "xid" if xids else "signal", f"killed by {name}{seen}", cause)
    why = f"exit code {returncode}{seen}"
    return _exited(w, now, source, returncode, "xid" if xids else "failed", why, cause)


def refuse_grant(grant: AllocationGranted, *, now: dt.datetime, source: str, detail: str) -> JobExited:
    """The exit of a job whose grant this node cannot honour: it fails at once, saying why."""
    return JobExitedV2(
        id=event_id(now, f"{grant.id}/refused", 0),
        source=source,
        key=grant.node_id,
        occurred_at=now,
        job_id=grant.job_id,
        allocation_id=grant.allocation_id,
        node_id=grant.node_id,
        exit_code=1,
        reason="failed",
        detail=detail,
    )


def finish_due(workloads: list[Workload], *, now: dt.datetime, source: str) -> list[tuple[Workload, JobExited]]:
    """The workloads whose simulated end has come, each with its exit event."""
    done: list[tuple[Workload, JobExited]] = []
    for w in workloads:
        if w.ends_at is None or w.ends_at > now:
            continue
        n = len(done)
        if w.planned_exit == "oom":
            detail = f"simulated memory {w.memory_demand_mib} MiB exceeded the grant's limit {w.memory_limit_mib} MiB"
            done.append((w, _exited(w, now, source, OOM_EXIT_CODE, "oom", detail, _end_of(w), n)))
        else:
            done.append((w, _exited(w, now, source, 0, w.planned_exit, "", _end_of(w), n)))
    return done


def stop_revoked(
    workload: Workload,
    ended: AllocationRevoked | AllocationReleased | AllocationExpired,
    *,
    now: dt.datetime,
    source: str,
) -> JobExited:
    """Stop work whose allocation was taken back, given back while it ran, or whose lease ran out."""
    match ended:
        case AllocationRevoked():
            detail = ended.reason
        case AllocationReleased():
            detail = f"allocation released: {ended.reason}"
        case AllocationExpired():
            detail = "allocation lease expired"
    cause = f"{ended.id}/stopped/{workload.node_id}"
    return _exited(workload, now, source, REVOKED_EXIT_CODE, "revoked", detail, cause)


def _end_of(w: Workload) -> str:
    """The cause of a workload's own end: the workload (its allocation, node and start)."""
    return f"{w.allocation_id}/{w.node_id}/{w.started_at.isoformat()}/exited"


def _exited(
    w: Workload,
    now: dt.datetime,
    source: str,
    code: int,
    reason: ExitReason,
    detail: str,
    cause: str,
    n: int = 0,
) -> JobExited:
    return JobExitedV2(
        id=event_id(now, cause, n),
        source=source,
        key=w.node_id,
        occurred_at=now,
        job_id=w.job_id,
        allocation_id=w.allocation_id,
        node_id=w.node_id,
        exit_code=code,
        reason=reason,
        detail=detail,
        runtime_s=(now - w.started_at).total_seconds(),
    )
