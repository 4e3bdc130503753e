"""Every decision of the pure core that emits messages, made twice on the same generated input,
gives byte-identical messages (ids included: none is drawn at random), and the messages of one
decision never share an id.

Covered: `health.decide.decide`, `health.operator.act`, `fabric.link_health.link_events` (after
`observe`), every message-returning function of `workload` (`admit_grant`, `refuse_grant`,
`finish_due`, `process_exited`, `stop_revoked`), `pool.allocate.decide` and `expire`,
`sched.lifecycle.decide`, `restart`, `preempt`, `kill`, and `sched.pool_cycle.job_changes`.
Each property also checks that its examples emitted something, so it never passes vacuously.
"""

from __future__ import annotations

import copy
import datetime as dt
import os
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ibpool_core import workload as wl
from ibpool_core.fabric.link_health import Expected, LinkHealth, PortSample, Rules, link_events, observe
from ibpool_core.health.connections import ConnectionClosed, ConnectionOpened
from ibpool_core.health.decide import (
    FailoverConfig,
    FailoverRequest,
    GpuHealth,
    HealthState,
    Holding,
    NodeHealth,
    Observation,
    decide,
)
from ibpool_core.health.heartbeat import HeartbeatRules
from ibpool_core.health.job_exits import RetryRules
from ibpool_core.health.link_signals import LinkTarget
from ibpool_core.health.operator import (
    CordonNode,
    DrainNode,
    OperatorAction,
    OperatorRequest,
    RecoverGpu,
    RecoverNode,
    UncordonNode,
    act,
)
from ibpool_core.pool import allocate as al
from ibpool_core.pool.ledger import Ledger, apply
from ibpool_core.sched import lifecycle, records
from ibpool_core.sched.cycle import CycleConfig
from ibpool_core.sched.lifecycle import LifecycleConfig
from ibpool_core.sched.pool_cycle import ProposalStamp, job_changes, plan_cycle
from ibpool_core.sched.queueing import make_policy
from ibpool_core.sched.records import JobPlacement, JobRecord
from ibpool_proto.fabric import LinkDegraded, LinkRecovered, LinkStateChanged
from ibpool_proto.health import Cordoned, GpuFailed, NodeFailed, NodeRecovered, RequeueRequested, Uncordoned
from ibpool_proto.job import CancelJob, ExitReason, JobExited, JobFinished, JobStarted
from ibpool_proto.message import Message
from ibpool_proto.node import GpuInfo, GpuSample, NodeDeregistered, NodeHeartbeat, NodeRegistered, TelemetryReported
from ibpool_proto.pool import (
    AllocationExpired,
    AllocationGranted,
    AllocationRejected,
    AllocationReleased,
    AllocationRevoked,
    Enforcement,
    GpuAssignment,
    RejectReason,
    ReleaseAllocation,
    RenewLease,
    WorkloadSpec,
)
from libs.core.tests.pool_builders import a, health, hops, node, propose, quota, request

EXAMPLES = int(os.environ.get("IBPOOL_HYPOTHESIS_EXAMPLES", "50"))  # more for a long hunt
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
R = TypeVar("R")


class Seen:
    """How many messages the examples of one property emitted (a property that saw none proves nothing)."""

    def __init__(self) -> None:
        self.messages = 0


def twice(seen: Seen, make: Callable[[], R], messages: Callable[[R], Sequence[Message]]) -> R:
    """Decide twice, each time on a fresh deep copy of the input that `make` closes over: the same
    bytes both times, ids included, and no id twice within the decision. Returns the first result."""
    first, second = make(), make()
    one, two = list(messages(first)), list(messages(second))
    assert msgspec.json.encode(one) == msgspec.json.encode(two)
    ids = [m.id for m in one]
    assert len(set(ids)) == len(ids), f"an id repeats within one decision: {ids}"
    seen.messages += len(one)
    return first


def at(t: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=t)


# -- health: decide -------------------------------------------------------------------------------------

NODES = ("n0", "n1", "n2", "n3")
GPUS = 4
LINKS = {
    **{f"rail-{n}": LinkTarget(link_id=f"rail-{n}", kind="host_rail", node_ids=[n], rail=0) for n in NODES},
    "uplink": LinkTarget(link_id="uplink", kind="leaf_uplink", node_ids=list(NODES), leaf="leaf0"),
}
HEALTH = FailoverConfig(
    source="fc",
    heartbeat=HeartbeatRules(suspect_after_intervals=2.5, fail_after_s=3.0, clear_after_beats=3),
    stable_window_s=5.0,
    flap_memory_s=300.0,
    max_failed_fraction=0.5,
    min_failed_allowed=1,
    retry=RetryRules(requeue_backoff_s=1.0, flag_after_failures=2, max_requeues=3),
)
SAMPLES: dict[str, dict[str, Any]] = {
    "fine": {},
    "xid48": {"xids": [48]},
    "xid79": {"xids": [79]},
    "xid13": {"xids": [13]},
    "hot": {"temperature_c": 99.0},
    "ecc": {"ecc_volatile": 10_000},
}


def registered(n: str, t: float, oid: str) -> NodeRegistered:
    gpus = [GpuInfo(index=i, uuid=f"{n}-{i}", model="H100", memory_mib=81559) for i in range(GPUS)]
    return NodeRegistered(
        id=oid,
        source="agent",
        key=n,
        occurred_at=at(t),
        node_id=n,
        hostname=n,
        cpu_milli=1,
        memory_mib=1,
        gpus=gpus,
        backend="simulated",
    )


def grant_news(oid: str, alloc: int, n: str, gpus: list[int], t: float) -> AllocationGranted:
    return AllocationGranted(
        id=oid,
        source="pool",
        key=n,
        occurred_at=at(t),
        allocation_id=f"a{alloc}",
        job_id=f"j{alloc}",
        node_id=n,
        kind="whole",
        assignments=[GpuAssignment(node_id=n, gpu_index=g) for g in gpus],
        enforcement=Enforcement(),
        lease_expires_at=at(t + 3600),
        ledger_version=1,
    )


ObsSpec = tuple[str, str, int, str]  # (kind, node or link, a number, a variant)

obs_specs = st.tuples(
    st.sampled_from(
        [
            *("beat", "beat", "beat", "telemetry", "link", "granted", "exited", "finished", "released", "registered"),
            *("left", "closed", "opened"),
        ]
    ),
    st.sampled_from([*NODES, *LINKS]),
    st.integers(0, GPUS - 1),
    st.sampled_from([*SAMPLES, "down", "up", "flapping", "errors", "recovered", "xid", "completed", "lost"]),
)


def observation(spec: ObsSpec, oid: str, t: float) -> Observation | None:
    kind, where, k, variant = spec
    n = where if where in NODES else NODES[k % len(NODES)]
    link = where if where in LINKS else f"rail-{n}"
    match kind:
        case "beat":
            return NodeHeartbeat(id=oid, source="agent", key=n, occurred_at=at(t), node_id=n, seq=1, interval_s=1.0)
        case "telemetry":
            base = GpuSample(
                index=k, uuid=f"{n}-{k}", utilization_pct=0.0, memory_used_mib=0, temperature_c=50.0, power_w=100.0
            )
            gpu = msgspec.structs.replace(base, **SAMPLES.get(variant, {}))
            return TelemetryReported(id=oid, source="agent", key=n, occurred_at=at(t), node_id=n, gpus=[gpu])
        case "link" if variant in ("down", "up", "flapping"):
            return LinkStateChanged(
                id=oid,
                source="fm",
                key=link,
                occurred_at=at(t),
                link_id=link,
                state=variant,  # type: ignore[arg-type]
                previous_state="up",
                topology_version=1,
            )
        case "link" if variant == "recovered":
            common = {"id": oid, "source": "fm", "key": link, "occurred_at": at(t), "link_id": link}
            return LinkRecovered(**common, topology_version=1, problem="errors")  # type: ignore[arg-type]
        case "link":
            return LinkDegraded(
                id=oid, source="fm", key=link, occurred_at=at(t), link_id=link, topology_version=1, problem="errors"
            )
        case "granted":
            return grant_news(oid, k, n, [k, (k + 1) % GPUS], t)
        case "exited":
            reason: ExitReason = "xid" if variant == "xid" else "lost" if variant == "lost" else "completed"
            return JobExited(
                id=oid,
                source="agent",
                key=f"j{k}",
                occurred_at=at(t),
                job_id=f"j{k}",
                allocation_id=f"a{k}",
                node_id=n,
                exit_code=1,
                reason=reason,
            )
        case "finished":
            return JobFinished(id=oid, source="sched", key=f"j{k}", occurred_at=at(t), job_id=f"j{k}", state="failed")
        case "released":
            return AllocationReleased(
                id=oid,
                source="pool",
                key=n,
                occurred_at=at(t),
                allocation_id=f"a{k}",
                job_id=f"j{k}",
                node_id=n,
                ledger_version=2,
            )
        case "registered":
            return registered(n, t, oid)
        case "left":
            return NodeDeregistered(id=oid, source="agent", key=n, occurred_at=at(t), node_id=n, reason="drained")
        case "closed":  # the agent's last bus connection closed (nats-server's advisory)
            return ConnectionClosed(id=oid, source="agent", at=at(t))
        case "opened":
            return ConnectionOpened(id=oid, source="agent", at=at(t))
    return None


health_steps = st.lists(
    st.tuples(st.floats(0.5, 12.0), st.lists(obs_specs, max_size=8), st.floats(0.0, 4.0)), min_size=1, max_size=5
)


def test_health_decide_is_deterministic() -> None:
    seen = Seen()

    @SETTINGS
    @given(steps=health_steps, beats=st.sets(st.sampled_from(NODES)))
    def check(steps: list[tuple[float, list[ObsSpec], float]], beats: set[str]) -> None:
        first = [registered(n, 0.0, f"reg-{n}") for n in NODES] + [
            grant_news(f"grant-{i}", i, NODES[i], [0, 1], 0.0) for i in range(len(NODES))
        ]
        state = HealthState(links=LINKS, topology_version=1)
        batches: list[tuple[float, list[Observation], float]] = [(0.0, list(first), 0.0)]
        t = 0.0
        for i, (step, specs, lag) in enumerate(steps):
            t += step
            obs: list[Observation | None] = [
                observation(s, f"o{i}-{j}", t - step * j / 10) for j, s in enumerate(specs)
            ]
            # Some nodes keep beating; the others fall silent and the clock judges them.
            obs += [observation(("beat", n, 0, ""), f"b{i}-{n}", t) for n in sorted(beats)]
            batches.append((t, [o for o in obs if o is not None], lag))
        for t, batch, lag in batches:
            request = FailoverRequest(state=state, now=at(t), observations=batch, config=HEALTH, beats_lag_s=lag)
            reply = twice(seen, lambda r=request: decide(copy.deepcopy(r)), lambda r: r.events)  # type: ignore[misc]
            state = reply.state

    check()
    assert seen.messages > 0


# -- health: operator actions ---------------------------------------------------------------------------

gpu_healths = st.builds(
    GpuHealth,
    index=st.integers(0, GPUS - 1),
    failed=st.booleans(),
    cordoned=st.booleans(),
    reason=st.sampled_from(["", "XID 48", "hot"]),
    operator_cordon=st.sampled_from(["", "ops: fan"]),
)
node_healths = st.builds(
    NodeHealth,
    node_id=st.sampled_from(NODES[:2]),
    status=st.sampled_from(["healthy", "suspect", "failed"]),
    reason=st.sampled_from(["", "late", "XID 79"]),
    since=st.just(T0),
    last_beat=st.just(at(100)),
    cordoned=st.booleans(),
    needs_reboot=st.booleans(),
    gpus=st.lists(gpu_healths, max_size=3).map(lambda gs: {g.index: g for g in gs}),
    gpu_count=st.just(GPUS),
    operator_drain=st.sampled_from(["", "ops: bios update"]),
    operator_cordon=st.sampled_from(["", "ops: watch"]),
)
node_ids = st.sampled_from([*NODES[:2], *NODES[:2], *NODES[:2], NODES[2]])  # mostly a node the state has
actions: st.SearchStrategy[OperatorAction] = st.one_of(
    st.builds(RecoverGpu, node_id=node_ids, gpu_index=st.integers(-1, GPUS), reason=st.just("ops")),
    st.builds(RecoverNode, node_id=node_ids, reason=st.sampled_from(["ops", "ops: reseated"])),
    st.builds(DrainNode, node_id=node_ids, reason=st.sampled_from(["ops", "ops: bios"])),
    st.builds(CordonNode, node_id=node_ids, gpu_index=st.none() | st.integers(-1, GPUS), reason=st.just("ops")),
    st.builds(UncordonNode, node_id=node_ids, gpu_index=st.none() | st.integers(-1, GPUS), reason=st.just("ops")),
)
holdings = st.lists(
    st.tuples(st.integers(0, 3), st.sampled_from(NODES[:2]), st.lists(st.integers(0, GPUS - 1), max_size=2)),
    max_size=4,
).map(
    lambda hs: {
        f"a{i}/{n}": Holding(allocation_id=f"a{i}", job_id=f"j{i}", node_id=n, gpu_indices=sorted(set(g)))
        for i, n, g in hs
    }
)


def test_operator_actions_are_deterministic() -> None:
    seen = Seen()

    @SETTINGS
    @given(
        nodes=st.lists(node_healths, min_size=1, max_size=2), held=holdings, action=actions, t=st.floats(100.0, 200.0)
    )
    def check(nodes: list[NodeHealth], held: dict[str, Holding], action: OperatorAction, t: float) -> None:
        state = HealthState(nodes={n.node_id: n for n in nodes}, holdings=held)
        request = OperatorRequest(state=state, now=at(t), action=action, config=HEALTH)
        twice(seen, lambda: act(copy.deepcopy(request)), lambda r: r.events)

    check()
    assert seen.messages > 0


# -- fabric: link health ----------------------------------------------------------------------------------

port_samples = st.lists(
    st.tuples(
        st.floats(1.0, 40.0),  # seconds since the previous sample
        st.booleans() | st.just(True),
        st.sampled_from([4, 4, 2, 1]),
        st.sampled_from([100.0, 100.0, 50.0]),
        st.integers(0, 5_000),  # symbol errors added
        st.integers(0, 10**10),  # xmit wait ticks added
    ),
    min_size=1,
    max_size=12,
)


def test_link_events_are_deterministic() -> None:
    seen = Seen()
    rules = Rules(flap_changes=3, flap_window_s=60, errors_per_s=1.0, congestion_ratio=0.5, clear_after_s=30)
    expected = Expected(width=4, lane_gbps=100.0)

    @SETTINGS
    @given(link=st.sampled_from(["L1", "L2"]), samples=port_samples)
    def check(link: str, samples: list[tuple[float, bool, int, float, int, int]]) -> None:
        health, t, errors, wait = LinkHealth(link_id=link), 0.0, 0, 0
        for step, up, width, lane, more_errors, more_wait in samples:
            t, errors, wait = t + step, errors + more_errors, wait + more_wait
            counters = {"symbol_error": errors, "port_xmit_wait": wait}
            sample = PortSample(link_id=link, at=at(t), up=up, width=width, lane_gbps=lane, counters=counters)

            def judged(before: LinkHealth = health, s: PortSample = sample) -> list[Message]:
                before = copy.deepcopy(before)
                after, findings = observe(before, s, expected, rules)
                return list(link_events(before, after, findings, topology_version=3, source="fm"))

            twice(seen, judged, lambda events: events)
            health, _ = observe(health, sample, expected, rules)

    check()
    assert seen.messages > 0


# -- the node agent's workloads ---------------------------------------------------------------------------


def agent_grant(alloc: int, n: str, gpus: list[int], runtime: float, mem: int | None, cmd: bool) -> AllocationGranted:
    return AllocationGranted(
        id=f"grant-{alloc}-{n}",
        source="pool",
        key=n,
        occurred_at=T0,
        allocation_id=f"a{alloc}",
        job_id=f"j{alloc}",
        node_id=n,
        kind="whole",
        assignments=[GpuAssignment(node_id=n, gpu_index=g) for g in gpus],
        enforcement=Enforcement(env={"CUDA_VISIBLE_DEVICES": ",".join(map(str, gpus))}, memory_limit_mib=20_000),
        lease_expires_at=at(3600),
        ledger_version=1,
        workload=WorkloadSpec(
            simulated_runtime_s=runtime, simulated_memory_mib=mem, command=["python", "train.py"] if cmd else []
        ),
    )


agent_grants = st.builds(
    agent_grant,
    alloc=st.integers(0, 5),
    n=st.sampled_from(["n0", "n1", "elsewhere"]),
    gpus=st.lists(st.integers(0, 9), max_size=3),
    runtime=st.floats(1.0, 100.0),
    mem=st.none() | st.integers(1_000, 40_000),
    cmd=st.booleans(),
)


def test_workload_decisions_are_deterministic() -> None:
    seen = Seen()
    hosted = {"n0": 8, "n1": 8}

    @SETTINGS
    @given(
        grants=st.lists(agent_grants, min_size=1, max_size=5, unique_by=lambda g: (g.allocation_id, g.node_id)),
        allow=st.booleans(),
        t=st.floats(0.0, 200.0),
        codes=st.lists(st.none() | st.integers(-15, 3), min_size=1, max_size=5),
        xids=st.lists(st.sampled_from([13, 48, 79]), max_size=2),
    )
    def check(grants: list[AllocationGranted], allow: bool, t: float, codes: list[int | None], xids: list[int]) -> None:
        now = at(t)
        running: list[wl.Workload] = []
        for g in grants:
            decision = twice(
                seen,
                lambda g=g: wl.admit_grant(  # type: ignore[misc]
                    copy.deepcopy(g),
                    hosted_nodes=hosted,
                    running=set(),
                    now=T0,
                    source="agent",
                    default_runtime_s=60.0,
                    allow_commands=allow,
                ),
                lambda d: (
                    [d.started]
                    if isinstance(d, wl.GrantAdmitted)
                    else [d.exited]
                    if isinstance(d, wl.GrantRefused)
                    else []
                ),
            )
            if isinstance(decision, wl.GrantAdmitted):
                running.append(decision.workload)
            twice(
                seen,
                lambda g=g: [wl.refuse_grant(copy.deepcopy(g), now=now, source="agent", detail="enforcement")],  # type: ignore[misc]
                lambda events: events,
            )
        twice(
            seen,
            lambda: wl.finish_due(copy.deepcopy(running), now=now, source="agent"),
            lambda done: [e for _, e in done],
        )
        for w, code in zip(running, codes * len(running), strict=False):
            twice(
                seen,
                lambda w=w, code=code: [  # type: ignore[misc]
                    wl.process_exited(copy.deepcopy(w), code, now=now, source="agent", xids=xids)
                ],
                lambda events: events,
            )
            common = {"source": "pool", "key": w.node_id, "allocation_id": w.allocation_id, "job_id": w.job_id}
            for ended in (
                AllocationRevoked(id="rev", **common, node_id=w.node_id, ledger_version=2, reason="node failed"),  # type: ignore[arg-type]
                AllocationReleased(id="rel", **common, node_id=w.node_id, ledger_version=2),  # type: ignore[arg-type]
                AllocationExpired(id="exp", **common, node_id=w.node_id, ledger_version=2),  # type: ignore[arg-type]
            ):
                twice(
                    seen,
                    lambda w=w, e=ended: [wl.stop_revoked(copy.deepcopy(w), e, now=now, source="agent")],  # type: ignore[misc]
                    lambda events: events,
                )

    check()
    assert seen.messages > 0


# -- the pool allocator ---------------------------------------------------------------------------------

POOL_NODES = ("p0", "p1", "p2")


def pool_input(spec: tuple[str, int, int, int, int]) -> al.Input:
    kind, k, g, size, n = spec
    node_id = POOL_NODES[n % len(POOL_NODES)]
    match kind:
        case "propose":
            gpus = [a(node_id, (g + i) % 4) for i in range(size)]
            return propose(f"j{k}", *gpus, version=k % 6, cmd_id=f"prop-{k}-{g}-{n}")
        case "fraction":
            return propose(f"j{k}", a(node_id, g, milli=250, memory=1000), version=k % 6, cmd_id=f"frac-{k}-{g}")
        case "request":
            return request(f"j{k}", "whole", gpus_per_host=size, cmd_id=f"req-{k}-{size}")
        case "gang":
            return request(f"j{k}", "gang", gpus_per_host=size, hosts=2, cmd_id=f"gang-{k}-{size}")
        case "release":
            return ReleaseAllocation(
                id=f"rel-{k}-{g}", source="sched", key=f"prop-{k}", allocation_id=f"prop-{k}-{g}-{n}"
            )
        case "renew":
            return RenewLease(
                id=f"renew-{k}-{g}", source="sched", key=f"req-{k}", allocation_id=f"req-{k}-{size}", holder=f"j{k}"
            )
        case "quota":
            return quota("t1", milli=1000 * size)
        case "failed":
            return health(NodeFailed, node_id, id=f"fail-{k}-{n}", reason="lost")
        case "recovered":
            return health(NodeRecovered, node_id, id=f"rec-{k}-{n}")
        case "gpu_failed":
            return health(GpuFailed, node_id, id=f"gpu-{k}-{g}-{n}", gpu_index=g, reason="XID 48")
        case "cordoned":
            return health(Cordoned, node_id, id=f"cord-{k}-{n}", scope="node", reason="ops")
        case "uncordoned":
            return health(Uncordoned, node_id, id=f"uncord-{k}-{n}", scope="node")
        case _:
            return node(node_id, gpus=4, uuid_tag=f"-{k % 2}")


pool_specs = st.lists(
    st.tuples(
        st.sampled_from(
            [
                *("propose", "propose", "fraction", "request", "gang", "release", "renew", "quota"),
                *("failed", "recovered", "gpu_failed", "cordoned", "uncordoned", "registered"),
            ]
        ),
        st.integers(0, 5),
        st.integers(0, 3),
        st.integers(1, 4),
        st.integers(0, 2),
    ),
    min_size=1,
    max_size=20,
)


def test_allocator_decisions_are_deterministic() -> None:
    seen = Seen()

    @SETTINGS
    @given(specs=pool_specs, expire_every=st.integers(2, 6))
    def check(specs: list[tuple[str, int, int, int, int]], expire_every: int) -> None:
        ledger = Ledger()
        for n in POOL_NODES:
            al.handle(ledger, node(n, gpus=4), T0, hops=hops)
        fresh: list[str] = []  # ids of the events first decided here, all at one time: never two alike
        for i, spec in enumerate(specs):
            cmd = pool_input(spec)
            now = at(1.0 + i // 3)  # several decisions share one instant
            decision = twice(
                seen,
                lambda cmd=cmd, now=now: al.decide(copy.deepcopy(ledger), cmd, now, hops=hops),  # type: ignore[misc]
                lambda d: d.events,
            )
            if not decision.repeat:
                fresh += [e.id for e in decision.events]
            apply(ledger, decision.events)
            if i % expire_every == 0:
                later = at(400.0 + i)  # past the default lease of 300 s
                expired = twice(seen, lambda later=later: al.expire(copy.deepcopy(ledger), later), lambda d: d.events)  # type: ignore[misc]
                fresh += [e.id for e in expired.events]
                apply(ledger, expired.events)
        assert len(set(fresh)) == len(fresh)

    check()
    assert seen.messages > 0


# -- the scheduler: a job's life ----------------------------------------------------------------------

LIFE = LifecycleConfig(source="sched", max_attempts=2, retry_after_s=5.0)


def life_gpus(*nodes: str) -> list[GpuAssignment]:
    return [GpuAssignment(node_id=n, gpu_index=i) for n in nodes for i in range(2)]


def life_job(state: str, hosts: int, replace: bool, attempt: int, replacing: str | None) -> JobRecord:
    nodes = [f"n{i}" for i in range(hosts)]
    job = JobRecord(
        job_id="j",
        tenant="t",
        queue="q",
        gpus_per_host=2,
        hosts=hosts,
        submitted_at=T0,
        queued_at=T0,
        attempt=attempt,
        on_member_failure="replace" if replace else "restart",
        time_limit_s=60.0,
    )
    if state == "queued":
        return job
    job = records.proposed(job, "a1", life_gpus(*nodes), 3, JobPlacement(ranks=nodes))
    if state == "proposed":
        return job
    job = records.granted(job, "a1", nodes, T0)
    job = msgspec.structs.replace(job, state=state, started_at=T0 if state == "running" else None)
    if replacing is not None and replacing in nodes:
        job = msgspec.structs.replace(job, replacing=replacing)
    return job


def life_news(kind: str, n: str, variant: str, alloc: str) -> lifecycle.News:
    oid = f"news-{kind}-{n}-{variant}-{alloc}"
    match kind:
        case "cancel":
            return CancelJob(id=oid, source="user", key="j", job_id="j")
        case "started":
            return JobStarted(
                id=oid, source="agent", key="j", job_id="j", allocation_id=alloc, node_id=n, launcher="sim"
            )
        case "exited":
            exit_reason: ExitReason = "completed"
            for r in ("xid", "lost", "failed", "revoked"):
                if variant == r:
                    exit_reason = r
            return JobExited(
                id=oid,
                source="agent",
                key="j",
                job_id="j",
                allocation_id=alloc,
                node_id=n,
                exit_code=0,
                reason=exit_reason,
            )
        case "granted":
            return AllocationGranted(
                id=oid,
                source="pool",
                key=n,
                job_id="j",
                allocation_id=alloc,
                node_id=n,
                kind="gang",
                assignments=life_gpus(n),
                enforcement=Enforcement(),
                lease_expires_at=at(3600),
                ledger_version=7,
                nodes=["n0", "n1"],
                replaces="n1" if variant == "replaces" else None,
            )
        case "rejected":
            reject: RejectReason = "would_exceed_capacity"
            for q in ("conflict", "stale", "over_quota"):
                if variant == q:
                    reject = q
            return AllocationRejected(id=oid, source="pool", key="j", job_id="j", command_id=alloc, reason=reject)
        case "revoked":
            return AllocationRevoked(
                id=oid,
                source="pool",
                key=n,
                job_id="j",
                allocation_id=alloc,
                node_id=n,
                ledger_version=7,
                reason="node failed",
            )
        case "expired":
            return AllocationExpired(
                id=oid, source="pool", key=n, job_id="j", allocation_id=alloc, node_id=n, ledger_version=7
            )
        case _:
            return RequeueRequested(
                id=oid,
                source="fc",
                key="j",
                job_id="j",
                allocation_id=alloc,
                node_id=n,
                reason="xid 79",
                retry_after_s=30.0,
            )


life_jobs = st.builds(
    life_job,
    state=st.sampled_from(["queued", "proposed", "scheduled", "running", "running"]),
    hosts=st.integers(1, 3),
    replace=st.booleans(),
    attempt=st.integers(0, 2),
    replacing=st.none() | st.sampled_from(["n1", "n2"]),
)
life_newses = st.builds(
    life_news,
    kind=st.sampled_from(["cancel", "started", "exited", "granted", "rejected", "revoked", "expired", "requeue"]),
    n=st.sampled_from(["n0", "n1", "n2"]),
    variant=st.sampled_from(["completed", "xid", "lost", "failed", "revoked", "conflict", "over_quota", "replaces"]),
    alloc=st.sampled_from(["a1", "a1", "a2"]),
)


def test_job_lifecycle_is_deterministic() -> None:
    seen = Seen()

    @SETTINGS
    @given(job=life_jobs, news=st.lists(life_newses, min_size=1, max_size=4), t=st.floats(30.0, 300.0))
    def check(job: JobRecord, news: list[lifecycle.News], t: float) -> None:
        now = at(t)
        for n in news:
            step = twice(
                seen,
                lambda j=job, n=n: lifecycle.decide(copy.deepcopy(j), n, now, LIFE),  # type: ignore[misc]
                lambda tr: tr.events,
            )
            job = step.job or job
        if job.holding and job.allocation_id is not None:
            twice(seen, lambda: lifecycle.restart(copy.deepcopy(job), "no host fits", now, LIFE), lambda tr: tr.events)
            twice(seen, lambda: lifecycle.preempt(copy.deepcopy(job), "vip", now, LIFE), lambda tr: tr.events)
        twice(seen, lambda: lifecycle.kill(copy.deepcopy(job), now, LIFE), lambda tr: tr.events)

    check()
    assert seen.messages > 0


# -- the scheduler: a cycle's proposals ---------------------------------------------------------------------


def cycle_node(node_id: str, leaf: str) -> NodeRegistered:
    """An 8-GPU node under `leaf`, with a fixed id (the pool builders' node, labelled)."""
    return msgspec.structs.replace(node(node_id, gpus=8), id=f"reg-{node_id}", labels={"ibpool.io/leaf": leaf})


cycle_jobs = st.lists(
    st.tuples(st.sampled_from([1, 2, 4, 8]), st.integers(1, 2), st.integers(0, 3), st.integers(0, 3)),
    min_size=1,
    max_size=6,
)


def test_cycle_proposals_are_deterministic() -> None:
    seen = Seen()

    @SETTINGS
    @given(
        specs=cycle_jobs,
        hosts=st.integers(1, 4),
        term=st.none() | st.integers(1, 5),
        t=st.floats(5.0, 100.0),
        policy=st.sampled_from(["fifo", "priority", "las"]),
    )
    def check(specs: list[tuple[int, int, int, int]], hosts: int, term: int | None, t: float, policy: str) -> None:
        ledger = Ledger()
        for h in range(hosts):
            al.handle(ledger, cycle_node(f"h{h}", f"leaf{h // 2}"), T0)
        live = [
            JobRecord(
                job_id=f"j{i}",
                tenant="t",
                queue="q",
                gpus_per_host=gpus,
                hosts=n,
                submitted_at=at(i),
                queued_at=at(i),
                attempt=attempt,
                rejections=rejections,
            )
            for i, (gpus, n, attempt, rejections) in enumerate(specs)
        ]
        now = at(t)
        plan = plan_cycle(ledger, live, now, make_policy(policy), CycleConfig(), "ibpool.io/leaf")
        stamp = ProposalStamp(source="sched", group="main", lease_s=120.0, term=term)
        by_id = {j.job_id: j for j in live}

        def changes() -> list[Message]:
            out = job_changes(copy.deepcopy(plan), copy.deepcopy(by_id), now, LIFE, stamp)
            return [e for job_id in sorted(out) for e in out[job_id][2]]

        twice(seen, changes, lambda events: events)

    check()
    assert seen.messages > 0
