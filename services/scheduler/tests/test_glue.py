"""The scheduler's glue without a bus or database: request bodies, job records, and a cycle's exact placements."""

from __future__ import annotations

import datetime as dt

import msgspec
import pytest

from ibpool_core.pool import allocate as al
from ibpool_core.pool.ledger import Ledger
from ibpool_core.sched import records as jobs
from ibpool_core.sched.cycle import CycleConfig
from ibpool_core.sched.lifecycle import release_id
from ibpool_core.sched.pool_cycle import (
    CyclePlan,
    FreeCache,
    LeafSource,
    PlanCache,
    Proposal,
    host_view,
    plan_cycle,
    taken_in_flight,
)
from ibpool_core.sched.queueing import make_policy
from ibpool_core.sched.records import JobRecord, record_from_spec
from ibpool_proto.job import JobSpec
from ibpool_proto.node import GpuInfo, NodeRegistered
from ibpool_proto.pool import GpuAssignment, ProposePlacement, ResourceRequest
from ibpool_runtime.clock import SystemClock
from ibpool_runtime.config import ConfigError, load_config
from ibpool_runtime.http import BadBody
from ibpool_runtime.metrics import ServiceMetrics
from ibpool_runtime.service import Kit
from ibpool_scheduler.api import JobBody, spec_of
from ibpool_scheduler.config import SchedulerConfig
from ibpool_scheduler.service import Scheduler

T0 = dt.datetime(2026, 12, 1, 14, 0, tzinfo=dt.UTC)
MODEL = "NVIDIA H100 80GB HBM3"


def node(node_id: str, gpus: int = 8, leaf: str | None = None) -> NodeRegistered:
    return NodeRegistered(
        source="test",
        key=node_id,
        node_id=node_id,
        hostname=node_id,
        cpu_milli=64_000,
        memory_mib=512_000,
        gpus=[GpuInfo(index=i, uuid=f"GPU-{node_id}-{i}", model=MODEL, memory_mib=81_559) for i in range(gpus)],
        backend="test",
        labels={"ibpool.io/leaf": leaf} if leaf else {},
    )


def ledger_of(*inputs: al.Input) -> Ledger:
    ledger = Ledger()
    for i in inputs:
        al.handle(ledger, i, T0)
    return ledger


def job(job_id: str, gpus: int = 1, hosts: int = 1, *, at: float = 0.0, **kw: object) -> JobRecord:
    when = T0 + dt.timedelta(seconds=at)
    return JobRecord(
        job_id=job_id, tenant="t", queue="q", gpus_per_host=gpus, hosts=hosts, submitted_at=when, queued_at=when, **kw
    )


def plan(ledger: Ledger, live: list[JobRecord], at: float = 10.0, policy: str = "fifo"):  # type: ignore[no-untyped-def]
    return plan_cycle(ledger, live, T0 + dt.timedelta(seconds=at), make_policy(policy), CycleConfig(), "ibpool.io/leaf")


# -- bodies ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "body", "want"),
    [
        ("one GPU by default", {"tenant": "a"}, ResourceRequest(kind="whole", gpus_per_host=1)),
        ("whole GPUs", {"tenant": "a", "gpus": 4}, ResourceRequest(kind="whole", gpus_per_host=4)),
        (
            "gang by shape",
            {"tenant": "a", "hosts": 2, "gpus_per_host": 8},
            ResourceRequest(kind="gang", gpus_per_host=8, hosts=2),
        ),
        (
            "gang by total",
            {"tenant": "a", "hosts": 4, "gpus": 32},
            ResourceRequest(kind="gang", gpus_per_host=8, hosts=4),
        ),
        ("fraction", {"tenant": "a", "fraction": 0.25}, ResourceRequest(kind="fraction", gpus_per_host=1, milli=250)),
        ("MIG", {"tenant": "a", "mig": "1g.10gb"}, ResourceRequest(kind="mig", gpus_per_host=1, mig_profile="1g.10gb")),
    ],
)
def test_body_becomes_the_request(name: str, body: dict[str, object], want: ResourceRequest) -> None:
    assert spec_of(msgspec.convert(body, JobBody)).request == want, name


@pytest.mark.parametrize(
    ("body", "path"),
    [
        ({"tenant": "a", "hosts": 2, "gpus": 7}, "$.gpus_per_host"),
        ({"tenant": "a", "hosts": 2, "gpus_per_host": 8, "gpus": 8}, "$.gpus"),
        ({"tenant": "a", "fraction": 0.5, "gpus": 2}, "$.fraction"),
        ({"tenant": "a", "gpus": 2, "memory_mib": 100}, "$.memory_mib"),
        ({"tenant": "a", "mig": "1g.10gb", "fraction": 0.5}, "$.mig"),
        ({"tenant": "a", "mig": "9g.99gb"}, "$.mig"),
        ({"tenant": "a", "mig": "7g.80gb", "gpu_model": "NVIDIA A100-SXM4-40GB"}, "$.mig"),  # its is 7g.40gb
    ],
)
def test_inconsistent_shapes_name_the_field(body: dict[str, object], path: str) -> None:
    with pytest.raises(BadBody) as e:
        spec_of(msgspec.convert(body, JobBody))
    assert e.value.path == path


@pytest.mark.parametrize(
    ("raw", "path"),
    [
        (b'{"tenant": "a", "gpus": 0}', "$.gpus"),
        (b'{"tenant": "a", "fraction": 1.5}', "$.fraction"),
        (b'{"tenant": "a", "topology": {"constraint": "maybe"}}', "$.topology.constraint"),
        (b'{"tenant": "a", "time_limit_s": -1}', "$.time_limit_s"),
        (b'{"tenant": "a", "id": "has.dot"}', "$.id"),
        (b'{"tenant": ""}', "$.tenant"),
        (b'{"gpus": 1}', None),
    ],
)
def test_invalid_bodies_carry_the_msgspec_path(raw: bytes, path: str | None) -> None:
    with pytest.raises(msgspec.ValidationError) as e:
        msgspec.json.decode(raw, type=JobBody)
    if path is not None:
        assert f"at `{path}`" in str(e.value)
    else:
        assert "tenant" in str(e.value)


@pytest.mark.parametrize(
    ("request_", "problem"),
    [
        (ResourceRequest(kind="remote"), "not scheduled here"),
        (ResourceRequest(kind="mig"), "with its mig_profile"),
        (ResourceRequest(kind="whole", mig_profile="1g.10gb"), "with its mig_profile"),
        (ResourceRequest(kind="mig", mig_profile="1g.10gb", gpus_per_host=2), "one instance of one GPU"),
        (ResourceRequest(kind="whole", gpus_per_host=0), "gpus (per host) >= 1"),
        (ResourceRequest(kind="fraction", gpus_per_host=2, milli=500), "one share of one GPU"),
    ],
)
def test_specs_the_scheduler_cannot_take(request_: ResourceRequest, problem: str) -> None:
    got = record_from_spec("j", JobSpec(name="n", tenant="t", request=request_), T0)
    assert isinstance(got, str) and problem in got


# -- records --------------------------------------------------------------------------------------


def test_requeue_keeps_the_place_and_counts_attempts() -> None:
    j = jobs.granted(jobs.proposed(job("a", 8), "p1", [], 3), "p1", ["n1"], T0)
    again = jobs.requeued(j, "node n1 failed", T0 + dt.timedelta(seconds=60), None)
    assert (again.state, again.attempt, again.submitted_at, again.allocation_id) == ("queued", 1, j.submitted_at, None)
    assert again.queued_at > j.queued_at and again.reason == "node n1 failed"


def test_one_release_id_per_allocation() -> None:
    assert release_id("a1") == release_id("a1") != release_id("a2")


# -- a cycle's plan -------------------------------------------------------------------------------


def test_gang_gets_whole_hosts_and_exact_gpus() -> None:
    ledger = ledger_of(node("n1"), node("n2"), node("n3"))
    got = plan(ledger, [job("gang", 8, 2), job("small", 2, at=1)])
    by_job = {p.job_id: p.assignments for p in got.proposals}
    gang_hosts = {a.node_id for a in by_job["gang"]}
    assert len(gang_hosts) == 2 and len(by_job["gang"]) == 16
    assert all(a.milli == 1000 for a in by_job["gang"])
    assert {a.node_id for a in by_job["small"]}.isdisjoint(gang_hosts)
    assert got.ledger_version == ledger.version


def test_granted_gpus_are_not_proposed_again() -> None:
    ledger = ledger_of(
        node("n1", 4),
        ProposePlacement(
            source="t",
            key="old",
            job_id="old",
            tenant="t",
            queue="q",
            ledger_version=1,
            assignments=[GpuAssignment(node_id="n1", gpu_index=i) for i in (0, 1)],
        ),
    )
    got = plan(ledger, [job("new", 2)])
    assert [(a.node_id, a.gpu_index) for a in got.proposals[0].assignments] == [("n1", 2), ("n1", 3)]


def test_proposals_in_flight_hold_their_gpus() -> None:
    ledger = ledger_of(node("n1", 4))
    flying = jobs.proposed(job("first", 3), "p1", [GpuAssignment(node_id="n1", gpu_index=i) for i in range(3)], 1)
    assert taken_in_flight(ledger, [flying]) == {"n1": {0, 1, 2}}
    got = plan(ledger, [flying, job("second", 2, at=1)])
    assert got.proposals == []
    assert got.waiting["second"].text().startswith("waiting for 2 GPUs on one host")


def test_the_loser_of_the_last_gpus_is_told_why() -> None:
    ledger = ledger_of(node("n1", 8))
    got = plan(ledger, [job("a", 8), job("b", 8, at=1)])
    assert [p.job_id for p in got.proposals] == ["a"]
    # The whole host went to a: b is told when a is expected to end (no limit: an hour x the 1.5 margin).
    assert got.waiting["b"].text() == "waiting for 8 GPUs on one host; earliest estimated start 2026-12-01 15:30"
    a, b = job("a", 6, time_limit_s=3600.0), job("b", 4, at=1)
    got = plan(ledger, [a, b])
    assert [p.job_id for p in got.proposals] == ["a"]
    # The next cycle knows where a runs and until when at the latest.
    a = jobs.proposed(a, "p1", got.proposals[0].assignments, 1)
    again = plan(ledger, [a, b], at=20)
    assert again.waiting["b"].text() == "waiting for 4 GPUs on one host; earliest estimated start 2026-12-01 15:00"


def test_a_proposal_in_flight_is_not_killed_for_its_wait() -> None:
    ledger = ledger_of(node("n1", 8))
    slow = jobs.proposed(job("slow", 8, time_limit_s=60.0), "p1", [GpuAssignment(node_id="n1", gpu_index=0)], 1)
    assert plan(ledger, [slow], at=3600).killed == []
    running = jobs.granted(slow, "p1", ["n1"], T0)
    assert plan(ledger, [running], at=3600).killed == ["slow"]


def test_cordoned_and_failed_nodes_are_not_offered() -> None:
    from ibpool_proto.health import Cordoned, NodeFailed

    ledger = ledger_of(
        node("n1", 2),
        node("n2", 2),
        node("n3", 2),
        Cordoned(source="f", key="n1", node_id="n1", scope="node", reason="hot"),
        NodeFailed(source="f", key="n2", node_id="n2", reason="silent"),
    )
    assert host_view(ledger, {}, LeafSource("ibpool.io/leaf")).node_ids == ["n3"]


def test_the_free_cache_follows_every_ledger_change() -> None:
    from ibpool_proto.health import Cordoned

    cache: FreeCache = {}
    ledger = ledger_of(node("n1", 4), node("n2", 4))
    assert [list(f) for f in host_view(ledger, {}, LeafSource("l"), cache).free_gpus] == [[0, 1, 2, 3], [0, 1, 2, 3]]
    unchanged = cache["n2"]
    grant = ProposePlacement(
        source="t",
        key="j",
        job_id="j",
        tenant="t",
        queue="q",
        ledger_version=ledger.version,
        assignments=[GpuAssignment(node_id="n1", gpu_index=1)],
    )
    for change in (grant, Cordoned(source="f", key="n2", node_id="n2", scope="gpu", gpu_index=3, reason="hot")):
        al.handle(ledger, change, T0)
        cached = host_view(ledger, {"n2": {0}}, LeafSource("l"), cache)
        assert cached == host_view(ledger, {"n2": {0}}, LeafSource("l"))  # the cache never changes the view
    assert [list(f) for f in cached.free_gpus] == [[0, 2, 3], [1, 2]]
    assert cache["n2"] is not unchanged  # the cordon replaced n2: recomputed
    al.handle(ledger, node("n3", 2), T0)
    before = cache["n1"]
    host_view(ledger, {}, LeafSource("l"), cache)
    assert cache["n1"] is before  # n1 did not change: reused


def test_a_cached_plan_is_the_plan() -> None:
    cache = PlanCache()
    ledger = ledger_of(node("b", 2), node("c", 2))
    on_c = [GpuAssignment(node_id="c", gpu_index=i) for i in (0, 1)]
    held = jobs.granted(jobs.proposed(job("held", 2, time_limit_s=600.0), "p0", on_c, 1), "p0", ["c"], T0)
    live = [held, job("small", 1, at=1), job("big", 2, at=2)]
    pol, cfg = make_policy("fifo"), CycleConfig()

    def both(at: float) -> CyclePlan:
        when = T0 + dt.timedelta(seconds=at)
        cached = plan_cycle(ledger, live, when, pol, cfg, "ibpool.io/leaf", cache)
        assert cached == plan_cycle(ledger, live, when, pol, cfg, "ibpool.io/leaf")
        return cached

    first = both(10)
    reused = cache.running["held"][1]
    assert both(20) == first and cache.running["held"][1] is reused
    # A node before c shifts c's host index: the held job's running picture is rebuilt.
    al.handle(ledger, node("a", 2), T0)
    both(30)
    assert cache.running["held"][1] is not reused
    assert cache.running["held"][1].hosts == ((2, 2),)


def test_required_topology_waits_for_one_leaf() -> None:
    ledger = ledger_of(node("a1", 8, "A"), node("a2", 8, "A"), node("b1", 8, "B"), node("b2", 8, "B"))
    busy = [GpuAssignment(node_id=n, gpu_index=0) for n in ("a2", "b2")]
    holder = jobs.granted(jobs.proposed(job("h", 1, 2), "p0", busy, 1), "p0", ["a2", "b2"], T0)
    got = plan(ledger, [holder, job("g", 8, 2, topology="required")])
    assert got.proposals == []
    assert "waiting for 2 hosts with 8 free GPUs under 1 leaves" in got.waiting["g"].text()


def test_waiting_job_past_not_before_only() -> None:
    ledger = ledger_of(node("n1", 8))
    later = job("later", 1, not_before=T0 + dt.timedelta(seconds=60))
    assert plan(ledger, [later], at=10).proposals == []
    assert [p.job_id for p in plan(ledger, [later], at=61).proposals] == ["later"]


def test_fraction_proposes_its_share() -> None:
    ledger = ledger_of(node("n1", 1))
    got = plan(ledger, [job("f", 1, milli=250, memory_mib=2048)])
    assert got.proposals[0].assignments == [GpuAssignment(node_id="n1", gpu_index=0, milli=250, memory_mib=2048)]


# -- config -----------------------------------------------------------------------------------------


def test_env_reaches_the_config() -> None:
    env = {"IBPOOL_SCHEDULER_POLICY": "las", "IBPOOL_SCHEDULER_BACKFILL": "none", "IBPOOL_SCHEDULER_LEASE_S": "60"}
    cfg = load_config(SchedulerConfig, "scheduler", env=env)
    assert (cfg.policy, cfg.backfill, cfg.lease_s) == ("las", "none", 60.0)


def test_unknown_backfill_names_the_field() -> None:
    with pytest.raises(ConfigError, match="backfill"):
        load_config(SchedulerConfig, "scheduler", env={"IBPOOL_SCHEDULER_BACKFILL": "eager"})


def test_unknown_policy_stops_the_service_naming_the_known_ones() -> None:
    cfg = SchedulerConfig(policy="lottery")
    kit = Kit(name="scheduler", config=cfg, bus=None, store=None, metrics=ServiceMetrics("scheduler"))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"unknown queue policy 'lottery'; known: .*fifo"):
        Scheduler(kit, SystemClock())


def test_leases_are_renewed_at_half_once_per_quarter() -> None:
    kit = Kit(name="scheduler", config=SchedulerConfig(), bus=None, store=None, metrics=ServiceMetrics("scheduler"))  # type: ignore[arg-type]
    sched = Scheduler(kit, SystemClock())
    proposal = ProposePlacement(
        id="p1",
        source="t",
        key="j",
        job_id="j",
        tenant="t",
        queue="q",
        ledger_version=1,
        assignments=[GpuAssignment(node_id="n1", gpu_index=0)],
        lease_s=300.0,
    )
    sched.feed.ledger = ledger_of(node("n1", 1), proposal)
    held = jobs.granted(jobs.proposed(job("j"), "p1", proposal.assignments, None), "p1", ["n1"], T0)
    assert sched.renewals([held], T0 + dt.timedelta(seconds=100)) == []
    (renewal,) = sched.renewals([held], T0 + dt.timedelta(seconds=200))
    assert (renewal.allocation_id, renewal.holder, renewal.extend_s) == ("p1", "j", 300.0)
    assert sched.renewals([held], T0 + dt.timedelta(seconds=201)) == []
    # What it remembers of past renewals does not grow with every allocation that ever ended.
    sched._renewed.update({f"ended-{i}": 0.0 for i in range(1_500)})
    assert sched.renewals([held], T0 + dt.timedelta(seconds=202)) == []
    assert list(sched._renewed) == ["p1"]


PROPOSAL = Proposal(job_id="j", assignments=[GpuAssignment(node_id="n1", gpu_index=0)])


@pytest.mark.parametrize(
    ("plan", "replacing", "durable"),
    [
        (CyclePlan(ledger_version=1), False, False),
        (CyclePlan(ledger_version=1, proposals=[PROPOSAL], waiting={"w": "no room"}), False, False),
        (CyclePlan(ledger_version=1, sites={"s": ("east", "nearer its data")}), False, False),
        (CyclePlan(ledger_version=1, proposals=[PROPOSAL], preempted=[("v", "j")]), False, True),
        (CyclePlan(ledger_version=1, killed=["k"]), False, True),
        (CyclePlan(ledger_version=1, proposals=[PROPOSAL]), True, True),
    ],
    ids=["empty", "proposes and waits", "chooses a site", "preempts", "kills", "replaces a member"],
)
def test_only_a_cycle_that_preempts_kills_or_replaces_waits_for_the_disk(
    plan: CyclePlan, replacing: bool, durable: bool
) -> None:
    assert plan.commits_durably(replacing) is durable


def test_a_mig_spec_becomes_a_record_of_one_instance() -> None:
    spec = JobSpec(name="n", tenant="t", request=ResourceRequest(kind="mig", mig_profile="1g.10gb"))
    got = record_from_spec("j", spec, T0)
    assert isinstance(got, JobRecord) and (got.mig_profile, got.gpus, got.milli) == ("1g.10gb", 1, 1000)
