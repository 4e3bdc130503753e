"""The service's cycle and the simulator's decide the same: one request through `plan.plan_cycle`
(the scheduler service's path: ledger, job records, the published fabric) and through the
simulator's path (`ibpool_sim.cluster_sim.SimFabric`: the core's `schedule()` with the framework
placer on the same fabric) gives the same hosts, rank order, tier and SHARP decision for every job."""

from __future__ import annotations

import datetime as dt

import pytest

from ibpool_core.fabric.generators import generate
from ibpool_core.fabric.view import fabric_state
from ibpool_core.sched.cycle import CycleConfig, SchedulingRequest, schedule
from ibpool_core.sched.framework import Framework, build_profile
from ibpool_core.sched.jobs import FreeCapacity
from ibpool_core.sched.queueing import make_policy
from ibpool_core.sched.sharp import SharpDecision
from ibpool_scheduler.plan import PlacementInputs, core_job, plan_cycle
from ibpool_scheduler.service import DEFAULT_PROFILE
from ibpool_sim.cluster_sim import SimConfig, SimFabric

from .test_glue import T0, job, ledger_of, node

SPECS = ["rail_optimised:hosts=16,su_size=4", "fat_tree_2tier:hosts=24,radix=8,oversubscription=3,sharp=true"]


@pytest.mark.parametrize("spec", SPECS)
def test_the_service_and_the_simulator_place_a_cycle_alike(spec: str) -> None:
    topology = generate(spec)
    names = [h.name for h in topology.hosts]
    ledger = ledger_of(*(node(n) for n in names))
    jobs = [
        job("leaf-gang", 8, 2, topology="required", topology_level=1),
        job("spine-gang", 8, 5, at=1, topology="required", topology_level=2),
        job("small", 2, at=2),
        job("pair", 4, 2, at=3),
        job("whole", 8, at=4),
        job("too-wide", 1, 7, at=5, topology="required", topology_level=1),
    ]
    now = T0 + dt.timedelta(seconds=10)
    service = plan_cycle(
        ledger,
        jobs,
        now,
        make_policy("fifo"),
        CycleConfig(),
        "ibpool.io/leaf",
        placement=PlacementInputs(
            Framework(build_profile(DEFAULT_PROFILE)), fabric=fabric_state(topology, version=1, origin="t"), sample=16
        ),
    )
    sim = SimFabric(topology, SimConfig(placement_sample=16))
    assert sim.names == sorted(names)
    reply = schedule(
        SchedulingRequest(
            now=now.timestamp(),
            queue=[core_job(j) for j in jobs],
            running=[],
            cluster=FreeCapacity(free=[8] * len(sim.names), capacity=[8] * len(sim.names), leaf_of=sim.leaf_of),
            policy=make_policy("fifo"),
            config=CycleConfig(hosts_per_leaf=sim.hosts_per_leaf),
            placer=sim.placer,
        )
    )
    simulated = {}
    for start in reply.starts:
        placed = sim.placer.results.get(start.job_id)
        ranked = sim.ranked([h for h, _ in start.hosts], placed)
        sharp = placed is not None and placed.sharp and len(ranked) > 1
        decision = sim.trees.reserve(ranked, SharpDecision(enabled=sharp, reason="")) if sharp else None
        tier = sim.tier(ranked) if len(ranked) > 1 else None
        simulated[start.job_id] = (ranked, tier, decision is not None and decision.enabled)
    served = {p.job_id: (p.hosts, p.tier, p.sharp) for p in service.proposals}
    assert served == simulated
    assert {"leaf-gang", "spine-gang", "small", "pair", "whole"} <= set(served)
    assert "too-wide" in service.waiting and "too-wide" in reply.waiting
    assert service.waiting["too-wide"].code == reply.waiting["too-wide"].code == "unresolvable"
