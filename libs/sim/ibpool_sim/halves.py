"""Tuned on the first half of a trace, reported on the second.

A tuned parameter chosen on the same jobs it is reported on overstates what it buys. Here the trace
is cut in two in time order (`split`); `gittins-learned`'s queue thresholds are chosen among
`CANDIDATES` by the average JCT each gives on the first half alone (`tune`), and the line-up is then
run on the second half alone with the chosen thresholds (`report_entries`). Nothing the second half
holds reaches a choice: the plain `gittins` policy's service distribution is taken from the first
half too, and the runtime predictors start empty on each half.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import msgspec

from .cluster_sim import gittins_samples
from .sched_lineup import LearnedThresholds, LineupEntry
from .traces import TraceJob

# The candidate ladders of `gittins-learned` (seconds of attained service): a first threshold, then
# one rung every `ratio` times longer from `start` on, up to about 256 h. The shipped ladder
# (`sched_lineup.LEARNED_GITTINS`) is the first: `600s,x2 from 1h`.
CANDIDATES: tuple[LearnedThresholds, ...] = (
    LearnedThresholds(first_s=600.0, start_s=3600.0, ratio=2.0),
    LearnedThresholds(first_s=600.0, start_s=1800.0, ratio=2.0),
    LearnedThresholds(first_s=600.0, start_s=7200.0, ratio=2.0),
    LearnedThresholds(first_s=300.0, start_s=3600.0, ratio=2.0),
    LearnedThresholds(first_s=1800.0, start_s=3600.0, ratio=2.0),
    LearnedThresholds(first_s=600.0, start_s=3600.0, ratio=4.0),
)


def split(trace: Sequence[TraceJob]) -> tuple[list[TraceJob], list[TraceJob]]:
    """The first and the second half of `trace` by submit order (the first holds the odd job out),
    each with its submit times counted from its own first job."""
    ordered = sorted(trace, key=lambda t: (t.submit_s, t.id))
    cut = (len(ordered) + 1) // 2
    return _rebased(ordered[:cut]), _rebased(ordered[cut:])


def _rebased(jobs: list[TraceJob]) -> list[TraceJob]:
    if not jobs:
        return []
    origin = jobs[0].submit_s
    return [msgspec.structs.replace(t, submit_s=t.submit_s - origin) for t in jobs]


class Trial(msgspec.Struct, frozen=True, kw_only=True):
    """One candidate's figure on the first half."""

    thresholds: LearnedThresholds
    avg_jct_s: float


def tune(
    candidates: Sequence[LearnedThresholds],
    first_half: Sequence[TraceJob],
    run: Callable[[list[LineupEntry]], list[float]],
) -> tuple[LearnedThresholds, list[Trial]]:
    """The candidate with the lowest average JCT on `first_half` (ties: the earlier candidate) and
    every trial. `run` simulates entries on the first half and returns their average JCTs in order."""
    if not candidates:
        raise ValueError("no candidate thresholds to choose from")
    entries = [c.entry(label=f"gittins-learned[{c.name}]") for c in candidates]
    jcts = run(entries)
    trials = [Trial(thresholds=c, avg_jct_s=j) for c, j in zip(candidates, jcts, strict=True)]
    best = min(range(len(trials)), key=lambda i: (trials[i].avg_jct_s, i))
    return trials[best].thresholds, trials


def report_entries(
    entries: Sequence[LineupEntry], chosen: LearnedThresholds, first_half: Sequence[TraceJob]
) -> list[LineupEntry]:
    """`entries` for the second half: `gittins-learned` with the `chosen` thresholds, `gittins` and
    `dynamic` with their service distribution from `first_half`; the others as they are."""
    out = []
    for e in entries:
        if e.policy == "gittins-learned":
            out.append(chosen.entry(label=e.label))
        elif e.policy in ("gittins", "dynamic") and "samples" not in e.params:
            out.append(msgspec.structs.replace(e, params={**e.params, "samples": gittins_samples(first_half)}))
        else:
            out.append(e)
    return out
