"""The service's cycle and the simulator's decide the same: both call `ibpool_core.sched.plan.plan`;
one set of jobs through `pool_cycle.plan_cycle` (the scheduler service's path: ledger, job records,
the published fabric) and through the request the simulator builds (`ibpool_sim.cluster_sim`:
`SimFabric`'s placer, names and SHARP limits on the same fabric) gives the same placement for every
job: hosts in rank order, tier, SHARP and why, NCCL settings and trees."""

from __future__ import annotations

import datetime as dt

import msgspec
import pytest

from ibpool_core.fabric.generators import generate
from ibpool_core.fabric.view import fabric_state
from ibpool_core.sched.cycle import CycleConfig
from ibpool_core.sched.framework import Framework, build_profile
from ibpool_core.sched.jobs import FreeCapacity
from ibpool_core.sched.plan import PlanRequest, QueueRequest, plan
from ibpool_core.sched.pool_cycle import PlacementInputs, core_job, plan_cycle
from ibpool_core.sched.queueing import make_policy
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
    # The request as `ibpool_sim.cluster_sim.simulate` builds it on this fabric.
    reply = plan(
        PlanRequest(
            now=now.timestamp(),
            queues=[
                QueueRequest(
                    jobs=[core_job(j) for j in jobs],
                    policy=make_policy("fifo"),
                    # (the simulator also sets explain=False: no wait reasons, the same starts)
                    config=CycleConfig(hosts_per_leaf=sim.hosts_per_leaf),
                )
            ],
            cluster=FreeCapacity(free=[8] * len(sim.names), capacity=[8] * len(sim.names), leaf_of=sim.leaf_of),
            names=sim.names,
            placer=sim.placer,
            sharp_limits=SimConfig().sharp_limits,
        )
    )
    simulated = {s.job_id: msgspec.structs.replace(s.placement, fabric_version=1) for s in reply.starts}
    served = {p.job_id: p.placement for p in service.proposals}
    assert served == simulated
    assert {"leaf-gang", "spine-gang", "small", "pair", "whole"} <= set(served)
    assert served["leaf-gang"].tier == 1 and (served["spine-gang"].tier or 9) <= 2
    assert "too-wide" in service.waiting and "too-wide" in reply.waiting
    assert service.waiting["too-wide"].code == reply.waiting["too-wide"].code == "unresolvable"
