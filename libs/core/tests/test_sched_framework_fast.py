"""The framework's fast paths decide as the straightforward ones: answers kept per ask shape and host
(`Profile.host_local`) and a `FrameworkPlacer` reused across cycles (`start_cycle`), against the same
cycles with every plugin asked every time and a new placer per cycle."""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import Mapping
from typing import Any

import msgspec
import pytest

from ibpool_core.sched.cycle import CycleConfig, SchedulingReply, SchedulingRequest, schedule
from ibpool_core.sched.framework import (
    ClusterView,
    Framework,
    HostState,
    PlacementAsk,
    Profile,
    Telemetry,
    build_profile,
)
from ibpool_core.sched.framework_placer import AskHints, FrameworkPlacer, leaf_fabric
from ibpool_core.sched.jobs import FreeCapacity, Job, RunningJob
from ibpool_core.sched.plugins import default_registry
from ibpool_core.sched.profiles import SCHEDULER_PROFILE
from ibpool_core.sched.queueing import make_policy

NOW = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC)
MODELS = ("H100", "A100")


def slow(profile: Profile) -> Profile:
    """The same plugins with the answers asked anew every time (the straightforward path)."""
    twin = Profile(
        name=profile.name,
        pre_filters=profile.pre_filters,
        filters=profile.filters,
        host_scores=profile.host_scores,
        gang_scores=profile.gang_scores,
        reserves=profile.reserves,
        permits=profile.permits,
        permit_timeout_s=profile.permit_timeout_s,
        max_candidates=profile.max_candidates,
    )
    twin.host_local = False
    return twin


class World:
    """A random cluster of 8-GPU hosts in leaves, with models, telemetry, datasets and bad links."""

    def __init__(self, rng: random.Random, hosts: int, leaves: int) -> None:
        self.names = [f"h{i:03d}" for i in range(hosts)]
        self.leaf = {n: f"L{i % leaves}" for i, n in enumerate(self.names)}
        self.model = {n: rng.choice(MODELS) for n in self.names}
        self.datasets = {"ds": rng.sample(self.names, 4)}
        self.links: dict[str, Any] = {n: rng.choice(("degraded", "flapping")) for n in rng.sample(self.names, 3)}
        self.free = [rng.choice((0, 2, 5, 8, 8, 8)) for _ in self.names]
        self.rng = rng

    def telemetry(self) -> dict[str, Telemetry]:
        rng = self.rng
        return {
            n: Telemetry(gpu_util=rng.random(), temperature_c=rng.uniform(30, 90), memory_used=rng.random())
            for n in rng.sample(self.names, len(self.names) // 3)
        }

    def view(self, telemetry: Mapping[str, Telemetry]) -> ClusterView:
        hosts = [
            HostState(
                name=n,
                gpu_model=self.model[n],
                total_gpus=8,
                free_gpus=self.free[i],
                telemetry=telemetry.get(n, Telemetry()),
                health="ready" if i % 17 else "cordoned",
            )
            for i, n in enumerate(self.names)
        ]
        return ClusterView(leaf_fabric(self.leaf), hosts, link_state=self.links, datasets=self.datasets)

    def jobs(self, cycle: int) -> tuple[list[Job], dict[str, AskHints]]:
        rng = self.rng
        queue: list[Job] = []
        hints: dict[str, AskHints] = {}
        for k in range(rng.randint(5, 25)):
            jid = f"c{cycle}-{k}"
            if rng.random() < 0.15:
                nodes = rng.choice((2, 3, 4))
                queue.append(Job(id=jid, tenant="t", gpus=nodes * 8, hosts=nodes, submit_time=float(k)))
            else:
                queue.append(Job(id=jid, tenant="t", gpus=rng.choice((1, 1, 1, 2, 4)), submit_time=float(k)))
            roll = rng.random()
            if roll < 0.15:
                hints[jid] = AskHints(dataset="ds", data_locality=rng.choice(("required", "preferred")))
            elif roll < 0.3:
                hints[jid] = AskHints(gpu_model=rng.choice(MODELS))
            elif roll < 0.4:
                hints[jid] = AskHints(compute_heavy=False)
        return queue, hints


def run(seed: int, fast: bool, sample: int) -> list[tuple[Any, ...]]:
    """Cycles on one world: the view kept across cycles (telemetry replaced in place, as the service
    does), the starts taken from the free counts; every cycle's reply and placement results."""
    rng = random.Random(seed)
    world = World(rng, hosts=rng.choice((24, 40, 64)), leaves=rng.choice((1, 3, 5)))
    profile = build_profile(SCHEDULER_PROFILE)
    framework = Framework(profile if fast else slow(profile))
    telemetry = world.telemetry()
    view = world.view(telemetry)
    leaf_ids = {leaf: i for i, leaf in enumerate(sorted(set(world.leaf.values())))}
    leaf_of = [leaf_ids[world.leaf[n]] for n in world.names]
    placer: FrameworkPlacer | None = None
    out: list[tuple[Any, ...]] = []
    running: list[RunningJob] = []
    for cycle in range(6):
        if cycle % 2 == 1:  # new telemetry for some hosts, none for others
            telemetry = world.telemetry()
            for n, host in view.hosts.items():
                t = telemetry.get(n, Telemetry())
                if host.telemetry != t:
                    view.replace_host(msgspec.structs.replace(host, telemetry=t))
        queue, hints = world.jobs(cycle)
        if fast and placer is not None:
            placer.start_cycle(hints, NOW)
        else:
            placer = FrameworkPlacer(framework, view, world.names, hints, NOW, sample)
            placer.count_first = fast  # the straightforward path asks the framework every time
        request = SchedulingRequest(
            now=1000.0 * cycle,
            queue=queue,
            running=running,
            cluster=FreeCapacity(free=list(world.free), capacity=[8] * len(world.names), leaf_of=leaf_of),
            policy=make_policy("fifo"),
            config=CycleConfig(backfill=rng.choice(("easy", "greedy")), hosts_per_leaf=8, explain=True),
            placer=placer,
        )
        reply: SchedulingReply = schedule(request)
        for start in reply.starts:
            for h, g in start.hosts:
                world.free[h] -= g
        # some GPUs come back between cycles
        for h in rng.sample(range(len(world.names)), 3):
            world.free[h] = 8
        results = {k: msgspec.structs.asdict(v) for k, v in sorted(placer.results.items())}
        out.append((msgspec.to_builtins(reply), results, dict(sorted(placer.reasons.items()))))
    return out


@pytest.mark.parametrize("sample", [0, 4])
@pytest.mark.parametrize("seed", range(8))
def test_fast_paths_place_as_the_straightforward_path(seed: int, sample: int) -> None:
    fast = run(seed, fast=True, sample=sample)
    assert fast == run(seed, fast=False, sample=sample)
    assert any(reply["starts"] for reply, _, _ in fast)  # the cycles did place jobs


def test_the_built_in_plugins_are_host_local_and_one_that_is_not_turns_the_answers_off() -> None:
    assert build_profile(SCHEDULER_PROFILE).host_local

    class Moody:
        def score_host(self, ask: PlacementAsk, view: ClusterView, host: HostState) -> float:
            return 50.0

    registry = default_registry()
    registry.register("moody", lambda args: Moody())
    profile = build_profile({**SCHEDULER_PROFILE, "score": [{"name": "moody"}]}, registry)
    assert not profile.host_local


def test_an_answer_is_asked_again_when_the_host_state_or_its_free_gpus_change() -> None:
    calls: list[str] = []

    class Counting:
        host_local = True

        def score_host(self, ask: PlacementAsk, view: ClusterView, host: HostState) -> float:
            calls.append(host.name)
            return 100.0 - 100.0 * host.telemetry.gpu_util

    registry = default_registry()
    registry.register("counting", lambda args: Counting())
    framework = Framework(build_profile({**SCHEDULER_PROFILE, "score": [{"name": "counting"}]}, registry))
    hosts = [HostState(name=n, gpu_model="H100", total_gpus=8, free_gpus=8) for n in ("a", "b")]
    view = ClusterView(leaf_fabric({"a": "l", "b": "l"}), hosts)

    def place(job_id: str) -> tuple[str, ...]:
        result = framework.place(PlacementAsk(job_id=job_id, gpus_per_host=1), view, NOW)
        assert result.status == "admitted", result.reason
        return result.hosts

    assert place("j1") == ("a",) and sorted(calls) == ["a", "b"]
    assert place("j2") == ("a",) and sorted(calls) == ["a", "b"]  # same shape, same hosts: kept
    view.set_free("b", 7)
    assert place("j3") == ("a",) and sorted(calls) == ["a", "b", "b"]  # b's free GPUs changed
    view.replace_host(msgspec.structs.replace(view.hosts["a"], telemetry=Telemetry(gpu_util=0.9)))
    assert place("j4") == ("b",) and sorted(calls) == ["a", "a", "b", "b"]  # a's state changed
    framework.place(PlacementAsk(job_id="j5", gpus_per_host=2), view, NOW)
    assert len(calls) == 6  # another shape asks anew
