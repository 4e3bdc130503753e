"""The service's cycle with the placement framework, fair share and per-queue policies, without a
bus or database: config errors, per-queue policy rules, and the exact placements a cycle makes."""

from __future__ import annotations

import datetime as dt
import random
from pathlib import Path
from typing import Any

import msgspec
import pytest

from ibpool_core.fabric.generators import generate
from ibpool_core.fabric.model import rename_hosts
from ibpool_core.fabric.view import FabricView, fabric_state
from ibpool_core.pool import allocate as al
from ibpool_core.sched import records as jobs
from ibpool_core.sched.cycle import CycleConfig
from ibpool_core.sched.fairshare import fairshare_factors, seeded_usage
from ibpool_core.sched.framework import Framework, Telemetry, build_profile
from ibpool_core.sched.pool_cycle import PlacementInputs, PlanCache, mig_hosts, plan_cycle
from ibpool_core.sched.queueing import make_policy
from ibpool_proto.fabric import LinkDegraded, LinkRecovered
from ibpool_proto.node import GpuSample, HcaPort, HcaPortsReported, NodeRegistered, TelemetryReported
from ibpool_runtime.clock import SystemClock
from ibpool_runtime.config import BaseConfig, ConfigError, load_config
from ibpool_runtime.fabric_feed import FabricFeed
from ibpool_runtime.metrics import ServiceMetrics
from ibpool_runtime.service import Kit
from ibpool_scheduler.api import queue_views
from ibpool_scheduler.config import SchedulerConfig
from ibpool_scheduler.node_feed import NodeFeed, PlacementTelemetry, link_guids, telemetry_of
from ibpool_scheduler.service import DEFAULT_PROFILE, Scheduler

from .test_glue import T0, job, ledger_of, node

HOT = Telemetry(gpu_util=0.9, temperature_c=83.0, memory_used=0.8)


def scheduler(**fields: object) -> Scheduler:
    kit = Kit(
        name="scheduler",
        config=msgspec.convert(fields, SchedulerConfig),
        bus=None,
        store=None,
        metrics=ServiceMetrics("s"),
    )  # type: ignore[arg-type]
    return Scheduler(kit, SystemClock())


def framework() -> Framework:
    return Framework(build_profile(DEFAULT_PROFILE))


def hosts_of(plan: object) -> dict[str, list[str]]:
    return {p.job_id: sorted({a.node_id for a in p.assignments}) for p in plan.proposals}  # type: ignore[attr-defined]


# -- config -----------------------------------------------------------------------------------------


def test_unknown_policy_of_one_queue_stops_the_service_naming_the_queue() -> None:
    with pytest.raises(ConfigError, match=r"queue_policies\.batch\.policy.*unknown queue policy 'lottery'"):
        scheduler(queue_policies={"batch": {"policy": "lottery"}})


def test_queue_policies_from_toml_and_their_names(tmp_path: Path) -> None:
    toml = tmp_path / "scheduler.toml"
    toml.write_text(
        '[scheduler.queue_policies.short]\npolicy = "sjf"\n[scheduler.queue_policies.gpu]\nbackfill = "none"\n'
    )
    cfg = load_config(SchedulerConfig, "scheduler", env={}, toml_path=toml)
    kit = Kit(name="scheduler", config=cfg, bus=None, store=None, metrics=ServiceMetrics("s"))  # type: ignore[arg-type]
    sched = Scheduler(kit, SystemClock())
    names = sched.queue_policy_names([job("x")])  # queue "q" of the job: the scheduler's own
    assert names == {"gpu": ("priority", "none"), "q": ("priority", "easy"), "short": ("sjf", "easy")}
    views = {v.queue: v for v in queue_views([job("x")], T0, names)}
    assert (views["short"].policy, views["short"].queued) == ("sjf", 0)
    assert (views["q"].policy, views["q"].queued) == ("priority", 1)


def test_an_unknown_consumer_in_cycle_takes_news_is_a_config_error_naming_the_known_ones() -> None:
    with pytest.raises(ConfigError, match=r"cycle_takes_news.*unknown 'nodes'.*known: jobs, pool, health"):
        scheduler(cycle_takes_news=["jobs", "nodes"])
    assert set(scheduler(cycle_takes_news=["pool"]).news) == {"jobs", "pool", "health"}


def test_bad_placement_profile_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"placement_profile.*unknown plugin 'warp'"):
        scheduler(placement_profile={"score": [{"name": "warp"}]})


# -- the cycle --------------------------------------------------------------------------------------


def test_a_compute_heavy_job_avoids_the_hot_node_and_a_fraction_does_not_care() -> None:
    ledger = ledger_of(node("n1", 8), node("n2", 8))
    inputs = PlacementInputs(framework(), telemetry={"n1": HOT})
    plan = plan_cycle(ledger, [job("a", 2)], T0, make_policy("fifo"), CycleConfig(), "ibpool.io/leaf", placement=inputs)
    assert hosts_of(plan) == {"a": ["n2"]}
    # the plain LeafPlacer reads no telemetry: lowest index
    plain = plan_cycle(ledger, [job("a", 2)], T0, make_policy("fifo"), CycleConfig(), "ibpool.io/leaf")
    assert hosts_of(plain) == {"a": ["n1"]}


def test_a_job_goes_where_its_dataset_is_and_required_gpu_model_filters() -> None:
    ledger = ledger_of(node("n1", 8), node("n2", 8), node("n3", 8))
    inputs = PlacementInputs(framework(), datasets={"imagenet": ["n3"]})
    jobs = [job("d", 2, dataset="imagenet"), job("m", 1, at=1, gpu_model="B200")]
    plan = plan_cycle(ledger, jobs, T0, make_policy("fifo"), CycleConfig(), "ibpool.io/leaf", placement=inputs)
    assert hosts_of(plan) == {"d": ["n3"]}
    assert plan.waiting["m"].text() == (
        "waiting for 1 GPUs on one host; never fits the current hosts"
        " (needs 1 host with 1 free GPU of B200; 0 in the whole fabric)"
    )


@pytest.mark.parametrize("placement", ["framework", "leaf"])
def test_a_job_requeued_off_a_failed_node_is_not_placed_there_while_the_pool_has_not_failed_it_yet(
    placement: str,
) -> None:
    # The requeue released the job's GPUs on n1 before the pool allocator applied n1's failure: in
    # this ledger n1 is free and healthy, its lowest index makes it the leaf placer's first choice.
    ledger = ledger_of(node("n1", 8), node("n2", 8))
    inputs = PlacementInputs(framework()) if placement == "framework" else PlacementInputs()
    until = T0 + dt.timedelta(seconds=30)
    lost = job("r", 8, avoid=["n1"], avoid_until=until)

    def plan_at(at: dt.datetime, live: list[Any]) -> Any:
        return plan_cycle(ledger, live, at, make_policy("fifo"), CycleConfig(), "ibpool.io/leaf", placement=inputs)

    if placement == "framework":
        assert hosts_of(plan_at(T0, [lost])) == {"r": ["n2"]}
    else:  # the leaf placer cannot keep a job off a host: it waits for the window instead
        assert hosts_of(plan_at(T0, [lost])) == {}
    # Only the avoided node is there: nothing is placed on it inside the window, and after it, it is.
    ledger = ledger_of(node("n1", 8))
    assert hosts_of(plan_at(T0, [lost])) == {}
    assert hosts_of(plan_at(until, [lost])) == {"r": ["n1"]}


def test_gang_stays_on_one_leaf_with_the_framework() -> None:
    ledger = ledger_of(*(node(f"n{i}", 8, leaf="a" if i <= 2 else "b") for i in range(1, 6)))
    inputs = PlacementInputs(framework())
    plan = plan_cycle(
        ledger, [job("g", 8, hosts=3)], T0, make_policy("fifo"), CycleConfig(), "ibpool.io/leaf", placement=inputs
    )
    assert hosts_of(plan) == {"g": ["n3", "n4", "n5"]}


def test_the_cache_reuses_the_placement_view_and_gives_the_same_plan() -> None:
    ledger = ledger_of(node("n1", 8), node("n2", 8))
    cache = PlanCache()
    for telemetry, expect in (({"n1": HOT}, ["n2"]), ({"n2": HOT}, ["n1"]), ({"n1": HOT}, ["n2"])):
        inputs = PlacementInputs(framework(), telemetry=telemetry)
        args = (ledger, [job("a", 2)], T0, make_policy("fifo"), CycleConfig(), "ibpool.io/leaf")
        cached = plan_cycle(*args, cache, placement=inputs)
        assert hosts_of(cached) == {"a": expect}
        assert cached == plan_cycle(*args, placement=inputs)
    assert cache.view is not None


def test_fair_share_puts_the_light_tenant_first_under_the_priority_policy() -> None:
    ledger = ledger_of(node("n1", 8))
    jobs = [job("heavy", 8, at=0), msgspec.structs.replace(job("light", 8, at=10), tenant="u")]
    policy = make_policy("priority")
    unfair = plan_cycle(ledger, jobs, T0, policy, CycleConfig(), "l", placement=PlacementInputs())
    assert hosts_of(unfair) == {"heavy": ["n1"]}
    fair = plan_cycle(ledger, jobs, T0, policy, CycleConfig(), "l", placement=PlacementInputs(fairshare={"t": 0.25}))
    assert hosts_of(fair) == {"light": ["n1"]}


def test_each_queue_is_ordered_by_its_own_policy() -> None:
    ledger = ledger_of(node("n1", 2))
    base = [job("long", 1, at=0, time_limit_s=3600), job("short", 1, at=1, time_limit_s=60), job("mid", 1, at=2)]
    none = CycleConfig(backfill="none")
    # the scheduler's policy (fifo) for queue q: the first two submitted
    fifo = plan_cycle(ledger, base, T0, make_policy("fifo"), none, "l")
    assert sorted(hosts_of(fifo)) == ["long", "short"]
    # queue q under its own sjf: the shortest limits first (a job without a limit is the longest)
    rules = {"q": (make_policy("sjf"), none)}
    sjf = plan_cycle(ledger_of(node("n1", 1)), base, T0, make_policy("fifo"), none, "l", queue_rules=rules)
    assert sorted(hosts_of(sjf)) == ["short"]
    fifo1 = plan_cycle(ledger_of(node("n1", 1)), base, T0, make_policy("fifo"), none, "l")
    assert sorted(hosts_of(fifo1)) == ["long"]


def test_two_queues_share_the_capacity_of_one_cycle_without_double_booking() -> None:
    ledger = ledger_of(node("n1", 4))
    a = [job(f"a{i}", 1, at=i) for i in range(3)]
    b = [msgspec.structs.replace(job(f"b{i}", 1, at=0.5 + i), queue="other") for i in range(3)]
    rules = {"other": (make_policy("fifo"), CycleConfig())}
    plan = plan_cycle(ledger, a + b, T0, make_policy("fifo"), CycleConfig(), "l", queue_rules=rules)
    gpus = [(x.node_id, x.gpu_index) for p in plan.proposals for x in p.assignments]
    assert len(gpus) == 4 and len(set(gpus)) == 4
    assert {"a0", "b0"} <= set(hosts_of(plan))  # the queue with the oldest job first, the other one next


# -- telemetry and links -----------------------------------------------------------------------------


def kit(name: str) -> Kit[Any]:
    return Kit(
        name=name,
        config=BaseConfig(instance="unit"),
        bus=None,  # type: ignore[arg-type]
        store=None,  # type: ignore[arg-type]
        metrics=ServiceMetrics(name),
    )


def test_telemetry_of_a_sample_and_link_states_per_node() -> None:
    sample = TelemetryReported(
        source="t",
        key="n1",
        node_id="n1",
        gpus=[
            GpuSample(index=0, uuid="g0", utilization_pct=100.0, memory_used_mib=40_000, temperature_c=80.0, power_w=1),
            GpuSample(index=1, uuid="g1", utilization_pct=0.0, memory_used_mib=0, temperature_c=40.0, power_w=1),
        ],
    )
    t = telemetry_of(sample, {0: 80_000, 1: 80_000})
    assert (t.gpu_util, t.temperature_c, t.memory_used) == (0.5, 80.0, 0.25)
    feed = NodeFeed(bus=None)  # type: ignore[arg-type]
    feed.on_message(
        HcaPortsReported(
            source="t",
            key="n1",
            node_id="n1",
            ports=[HcaPort(device="mlx5_0", port=1, node_guid="0xaa", state="ACTIVE")],
        )
    )
    link = "0xaa:1-0xbb:7"
    assert link_guids(link) == ("0xaa", "0xbb")
    links = FabricFeed(kit("scheduler"), FabricView(), fetch_timeout_s=1.0, durable_prefix="scheduler")
    links.on_link(LinkDegraded(source="f", key=link, link_id=link, topology_version=1, occurred_at=T0))
    assert feed.node_links(links.links) == {"n1": "degraded"}
    later = T0 + dt.timedelta(seconds=5)
    links.on_link(
        LinkRecovered(source="f", key=link, link_id=link, topology_version=1, problem="errors", occurred_at=later)
    )
    assert feed.node_links(links.links) == {}


def test_a_new_leader_seeds_fair_share_from_the_job_history() -> None:
    day = 86_400.0
    history = [
        ("heavy", 8, 3600.0, T0 - dt.timedelta(days=7)),  # one half-life ago: counts half
        ("light", 1, 3600.0, T0),
    ]
    running = jobs.granted(jobs.proposed(job("r", 2), "p", [], None), "p", ["n1"], T0 - dt.timedelta(seconds=100))
    state = seeded_usage(history, [running, job("q")], T0, 7 * day)
    assert state.usage_gpu_s == pytest.approx({"heavy": 8 * 3600 / 2, "light": 3600.0, "t": 200.0})
    assert state.updated_at == T0.timestamp()
    factors = fairshare_factors(state, ["heavy", "light", "t"])
    assert factors["heavy"] < factors["light"] < 1.0


def test_a_multi_node_gang_goes_under_a_sharp_capable_leaf_without_asking() -> None:
    def labelled(node_id: str, leaf: str, sharp: bool) -> NodeRegistered:
        n = node(node_id, 8, leaf=leaf)
        return msgspec.structs.replace(n, labels={**n.labels, "ibpool.io/sharp": "true"} if sharp else n.labels)

    ledger = ledger_of(*(labelled(f"n{i}", "a" if i <= 3 else "b", sharp=i > 3) for i in range(1, 7)))
    gang = [job("g", 8, hosts=2)]
    with_sharp = plan_cycle(
        ledger, gang, T0, make_policy("fifo"), CycleConfig(), "ibpool.io/leaf", placement=PlacementInputs(framework())
    )
    assert hosts_of(with_sharp) == {"g": ["n4", "n5"]}
    # the same fabric with no SHARP label: the first leaf
    no_sharp = plan_cycle(
        ledger,
        gang,
        T0,
        make_policy("fifo"),
        CycleConfig(),
        "ibpool.io/leaf",
        placement=PlacementInputs(framework(), sharp_label="ibpool.io/none"),
    )
    assert hosts_of(no_sharp) == {"g": ["n1", "n2"]}


def test_a_published_fabric_that_names_none_of_the_nodes_is_not_used_and_one_that_names_them_is() -> None:
    """A fabric monitor naming its hosts otherwise than the agents name their nodes: the labels stand
    in (gangs would otherwise never find two hosts on the fabric); a matching fabric is in force."""
    s = scheduler(instance="t")
    s.feed.ledger = ledger_of(*(node(f"n{i}") for i in range(1, 5)))
    other = generate("fat_tree_2tier:hosts=4,radix=4")  # node001..node004
    s.fabric.replace(fabric_state(other, version=1, origin="t"))
    assert s.fabric_in_force() is None and s.leaf_source().fabric is None
    named = rename_hosts(other, {f"node{i:03d}": f"n{i}" for i in range(1, 5)})
    s.fabric.replace(fabric_state(named, version=2, origin="t"))
    in_force = s.fabric_in_force()
    assert in_force is not None and in_force.about.version == 2 and s.leaf_source().fabric is in_force


def test_a_mig_job_goes_to_a_host_whose_gpus_have_its_profile_and_the_leaf_placer_leaves_it_waiting() -> None:
    plain, capable = node("n1", 8), node("n2", 8)
    capable = msgspec.structs.replace(
        capable, gpus=[msgspec.structs.replace(g, mig_capable=True) for g in capable.gpus]
    )
    ledger = ledger_of(plain, capable)
    slice_job = job("s", 1, at=1, mig_profile="1g.10gb")
    plan = plan_cycle(
        ledger, [slice_job], T0, make_policy("fifo"), CycleConfig(), "ibpool.io/leaf",
        placement=PlacementInputs(framework()),
    )  # fmt: skip
    [proposal] = plan.proposals
    assert [(a.node_id, a.mig_profile, a.milli) for a in proposal.assignments] == [("n2", "1g.10gb", 1000)]
    none_capable = ledger_of(node("n1", 8))
    waits = plan_cycle(
        none_capable, [slice_job], T0, make_policy("fifo"), CycleConfig(), "ibpool.io/leaf",
        placement=PlacementInputs(framework()),
    )  # fmt: skip
    assert waits.proposals == [] and "s" in waits.waiting
    leaf = plan_cycle(ledger, [slice_job], T0, make_policy("fifo"), CycleConfig(), "ibpool.io/leaf")
    assert leaf.proposals == []


def test_the_placement_telemetry_kept_by_changes_is_what_a_walk_over_every_sample_finds() -> None:
    """`PlacementTelemetry` against its definition (every node's newest sample not older than the
    limit, through `telemetry_of`), through samples that come late, out of order and age out."""
    rng = random.Random(3)
    feed = NodeFeed(bus=None)  # type: ignore[arg-type]
    kept = PlacementTelemetry(max_age_s=20.0)
    names = [f"n{i}" for i in range(12)]
    nodes = ledger_of(*(node(n, 2) for n in names[:9])).nodes  # three nodes the ledger does not know
    now = T0
    changed = 0
    for step in range(300):
        now += dt.timedelta(seconds=rng.choice((0.5, 1.0, 3.0)))
        for n in rng.sample(names, rng.randint(0, 3)):
            at = now - dt.timedelta(seconds=rng.choice((0.0, 0.0, 5.0, 25.0)))  # some late, some too old
            gpus = [
                GpuSample(index=g, uuid=f"{n}-{g}", utilization_pct=rng.choice((0.0, 90.0)), memory_used_mib=1000,
                          temperature_c=50.0, power_w=1)
                for g in range(2)
            ]  # fmt: skip
            feed.on_message(TelemetryReported(source="t", key=n, node_id=n, gpus=gpus, occurred_at=at))
        before = kept.view.log.version
        got = kept.update(feed, nodes, now)
        changed += got.log.version - before
        walk = {}
        for n, (at, sample) in feed.samples.items():
            if (now - at).total_seconds() <= 20.0:
                memory = {g.index: g.memory_mib for g in nodes[n].gpus} if n in nodes else {}
                walk[n] = telemetry_of(sample, memory)
        assert dict(got) == walk, step
    assert changed > 100 and len(kept._due) <= len(names)


def test_the_mig_capable_hosts_are_kept_with_the_layout_and_follow_a_node_registered_again() -> None:
    """`mig_hosts_cached` is `mig_hosts` through cycles: computed once while no node's GPUs change,
    again when a node comes back with MIG on (the same model and labels)."""
    plain, capable = node("n1", 8), node("n2", 8)
    mig_on = [msgspec.structs.replace(g, mig_capable=True) for g in capable.gpus]
    ledger = ledger_of(plain, msgspec.structs.replace(capable, gpus=mig_on))
    cache = PlanCache()
    slice_job = job("s", 1, at=1, mig_profile="1g.10gb")

    def cycle() -> frozenset[str]:
        plan_cycle(ledger, [slice_job], T0, make_policy("fifo"), CycleConfig(), "ibpool.io/leaf", cache,
                   placement=PlacementInputs(framework()))  # fmt: skip
        assert cache.layout is not None
        return cache.layout.mig["1g.10gb"]

    first = cycle()
    assert first == mig_hosts(ledger, "1g.10gb") == {"n2"}
    assert cycle() is first  # kept, not walked again
    again = msgspec.structs.replace(plain, gpus=[msgspec.structs.replace(g, mig_capable=True) for g in plain.gpus])
    al.handle(ledger, again, T0)  # registered again with MIG on
    assert cycle() == mig_hosts(ledger, "1g.10gb") == {"n1", "n2"}
