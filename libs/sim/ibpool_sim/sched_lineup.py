"""The policies `ibpool sim --policy all` compares on one trace, and the floors of issue 6 checked on them.

Every entry is (label, queue policy, backfill mode). Baselines: `fifo` (strict order),
`fifo+easy-exact` (EASY as the literature runs it: exact runtimes, the whole queue scanned),
`fifo+easy` (EASY as ibpool runs it: p90 predictions x 1.5, the whole queue scanned), `oracle-sjf`
(true durations, non-preemptive, starts any job that fits in order) and `oracle-srtf` (true
remaining time, preemptive). ibpool's own policies scan 128 queue positions per cycle (the
service's `scan_depth`). The ibpool policies use the
online `RecentMedianEstimator` (and `gittins-learned` its `RuntimeHistory`, fed as jobs end) and no
future knowledge.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from ibpool_core.sched.cycle import BackfillMode, CycleConfig
from ibpool_core.sched.sharp import SharpLimits

from .cluster_sim import HostFailure, SimConfig, SimResult, simulate
from .traces import TraceJob


class LearnedThresholds(msgspec.Struct, frozen=True, kw_only=True):
    """`gittins-learned`'s queues, in seconds of attained service: `first_s`, then one threshold every
    `ratio` times longer from `start_s` on, up to `top_s`."""

    first_s: float
    start_s: float
    ratio: float = 2.0
    top_s: float = 256 * 3600.0

    def __post_init__(self) -> None:
        if not (0 < self.first_s <= self.start_s <= self.top_s and self.ratio > 1.0):
            raise ValueError(f"thresholds need 0 < first <= start <= top and ratio > 1, got {self}")

    @property
    def seconds(self) -> list[float]:
        out, t = [self.first_s], self.start_s
        while t <= self.top_s * (1 + 1e-9):
            if t > out[-1]:
                out.append(t)
            t *= self.ratio
        return out

    @property
    def name(self) -> str:
        return f"{self.first_s:g}s,x{self.ratio:g} from {self.start_s / 3600:g}h"

    def entry(self, label: str = "gittins-learned") -> LineupEntry:
        return LineupEntry(
            label=label,
            policy="gittins-learned",
            backfill="greedy",
            params={"service": "time", "thresholds": self.seconds},
        )


# `gittins-learned`'s queues as shipped: 600 s, then doubling from 1 h to 256 h (docs/scheduling.md).
LEARNED_GITTINS = LearnedThresholds(first_s=600.0, start_s=3600.0)


# A scan depth that is the whole queue (no trace has this many jobs waiting).
WHOLE_QUEUE = 1 << 30


class LineupEntry(msgspec.Struct, frozen=True, kw_only=True):
    label: str
    policy: str
    backfill: BackfillMode
    baseline: bool = False
    oracle: bool = False
    params: dict[str, Any] = {}  # the queue policy's parameters (queueing.make_policy)
    scan_depth: int = 128  # queue positions examined per cycle
    exact_runtimes: bool = False  # the cycle plans with the trace's durations (a baseline's knowledge)


LINEUP: tuple[LineupEntry, ...] = (
    LineupEntry(label="fifo", policy="fifo", backfill="none", baseline=True),
    LineupEntry(
        label="fifo+easy-exact",
        policy="fifo",
        backfill="easy",
        baseline=True,
        oracle=True,
        scan_depth=WHOLE_QUEUE,
        exact_runtimes=True,
    ),
    LineupEntry(label="fifo+easy", policy="fifo", backfill="easy", baseline=True, scan_depth=WHOLE_QUEUE),
    LineupEntry(label="sjf", policy="sjf", backfill="easy"),
    LineupEntry(label="priority", policy="priority", backfill="easy"),
    LineupEntry(label="predictive", policy="predictive", backfill="easy"),
    LineupEntry(label="las", policy="las", backfill="greedy"),
    LineupEntry(label="gittins", policy="gittins", backfill="greedy"),
    LEARNED_GITTINS.entry(),
    LineupEntry(label="dynamic", policy="dynamic", backfill="greedy"),
    LineupEntry(label="oracle-sjf", policy="oracle-sjf", backfill="greedy", baseline=True, oracle=True),
    LineupEntry(label="oracle-srtf", policy="oracle-srtf", backfill="greedy", baseline=True, oracle=True),
)


def select(names: str) -> list[LineupEntry]:
    """`all`, or a comma list of labels from `LINEUP`; ValueError names the known labels."""
    if names == "all":
        return list(LINEUP)
    by_label = {e.label: e for e in LINEUP}
    unknown = [n for n in names.split(",") if n not in by_label]
    if unknown:
        raise ValueError(f"unknown policy {unknown[0]!r}; known: all, {', '.join(by_label)}")
    return [by_label[n] for n in names.split(",")]


def random_failures(seed: int, count: int, nodes: int, horizon_s: float, down_s: float = 3600.0) -> list[HostFailure]:
    """`count` host failures at uniform times over the trace, each down `down_s`; the same for a seed."""
    rng = random.Random(seed)
    return sorted(
        (HostFailure(host=rng.randrange(nodes), at_s=rng.uniform(0.0, horizon_s), down_s=down_s) for _ in range(count)),
        key=lambda f: f.at_s,
    )


class RunOptions(msgspec.Struct, frozen=True, kw_only=True):
    """What every policy of one run shares: the cluster, injected failures, gang span relaxation,
    placement; `fabric` a real fabric (cluster_sim.SimConfig.fabric) with its SHARP limits."""

    nodes: int = 80
    failures: tuple[HostFailure, ...] = ()
    span_relax_s: float = math.inf  # by default gangs wait for their minimal leaf span
    placement: str = "leaf"  # "leaf" or "framework" (cluster_sim.SimConfig.placement)
    sharp_leaf_share: float = 0.0
    fabric: str | None = None
    sharp_limits: SharpLimits = SharpLimits()


def config_for(entry: LineupEntry, options: RunOptions) -> SimConfig:
    """The simulator config of one line-up entry under the run's options."""
    return SimConfig(
        nodes=options.nodes,
        policy=entry.policy,
        policy_params=dict(entry.params),
        cycle=CycleConfig(
            backfill=entry.backfill, span_relax_after_s=options.span_relax_s, scan_depth=entry.scan_depth
        ),
        failures=list(options.failures),
        label=entry.label,
        placement=options.placement,
        sharp_leaf_share=options.sharp_leaf_share,
        fabric=options.fabric,
        sharp_limits=options.sharp_limits,
        exact_runtimes=entry.exact_runtimes,
    )


def run_entry(
    entry: LineupEntry,
    trace: Sequence[TraceJob],
    options: RunOptions,
    progress: Callable[[float], None] | None = None,
) -> SimResult:
    return simulate(trace, config_for(entry, options), progress=progress)


class FloorCheck(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    value: float
    limit: float
    holds: bool


def check_floors(summaries: Sequence[dict[str, float | int | str]], nodes: int) -> list[FloorCheck]:
    """Issue 6's floors on one run: best non-oracle ibpool policy vs oracle SJF and FIFO+EASY; leaf span."""
    by_label = {str(s["policy"]): s for s in summaries}
    ours = [s for s in summaries if not _entry(str(s["policy"])).baseline]
    checks: list[FloorCheck] = []
    if not ours:
        return checks
    best = min(ours, key=lambda s: float(s["avg_jct_s"]))
    best_jct = float(best["avg_jct_s"])
    if "oracle-sjf" in by_label:
        ratio = best_jct / float(by_label["oracle-sjf"]["avg_jct_s"])
        checks.append(
            FloorCheck(name=f"{best['policy']} avg JCT / oracle-sjf", value=ratio, limit=1.25, holds=ratio <= 1.25)
        )
    if "fifo+easy" in by_label:
        limit = 0.5 if nodes >= 80 else 0.3
        ratio = best_jct / float(by_label["fifo+easy"]["avg_jct_s"])
        checks.append(
            FloorCheck(name=f"{best['policy']} avg JCT / fifo+easy", value=ratio, limit=limit, holds=ratio <= limit)
        )
    for s in ours:
        share = float(s["min_span_share"])
        checks.append(
            FloorCheck(
                name=f"{s['policy']} multi-node starts at minimal leaf span",
                value=share,
                limit=0.95,
                holds=share >= 0.95,
            )
        )
    return checks


def _entry(label: str) -> LineupEntry:
    return next((e for e in LINEUP if e.label == label), LineupEntry(label=label, policy=label, backfill="easy"))
