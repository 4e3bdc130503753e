"""Link health from port samples: down/up, flapping, error rates, degraded width or speed, congestion.

Pure: `observe(health, sample, rules)` takes the link's previous health and one new sample and
returns the new health and the verdicts to publish. Rates come from counter deltas between two
samples; a counter that went backwards wrapped (when it was near its maximum) or was reset (to
zero). Hysteresis: a problem is raised once when it appears and cleared once it has stayed away
for `clear_after_s`, so a noisy link does not produce an event storm.

`link_events(before, after, findings)` turns what `observe` found into events. Their ids derive from
the cause (`ibpool_core.ids.event_id`): the sample judged (the link, its time and counters) and the
change of state it made, with each event's position; the same judgement gives the same events, ids
included, never a random id.
"""

from __future__ import annotations

import datetime as dt
from typing import Literal, TypedDict

import msgspec

from ibpool_proto.fabric import LinkDegraded, LinkFlapping, LinkRecovered, LinkStateChanged
from ibpool_proto.message import Event

from ..ids import EventIds

Problem = Literal["down", "flapping", "errors", "degraded_width", "degraded_speed", "congested"]
Verdict = Literal["raised", "cleared"]
LinkState = Literal["up", "down", "degraded", "flapping"]

# Counters of the IB PortCounters attribute that count errors (per second after differencing).
ERROR_COUNTERS = ("symbol_error", "link_error_recovery", "port_rcv_errors", "local_link_integrity_errors")
CONGESTION_COUNTER = "port_xmit_wait"
TICKS_PER_SECOND_AT_FULL_WAIT = 1.0e8  # PortXmitWait counts in ticks; ~1e8/s means always waiting


class PortSample(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """What one read of a port shows. `up` is the logical state (ACTIVE), `width`/`gbps` the active rate.

    gc=False (here and in LinkHealth): the fabric monitor holds one of each per link and makes new
    ones every poll (300,000 at 100,000 GPUs); tracked by the garbage collector they made it run
    full collections every poll. Neither can be part of a reference cycle: their fields are
    scalars, a dict of counters, a list of times, a dict of times and a PortSample."""

    link_id: str
    at: dt.datetime
    up: bool
    width: int | None = None
    lane_gbps: float | None = None
    counters: dict[str, int] = {}
    counter_bits: int = 64


class Expected(msgspec.Struct, frozen=True, kw_only=True):
    """What the topology says the link should run at."""

    width: int
    lane_gbps: float


class Rules(msgspec.Struct, frozen=True, kw_only=True):
    flap_changes: int = 3
    flap_window_s: float = 60.0
    errors_per_s: float = 1.0
    congestion_ratio: float = 0.5
    clear_after_s: float = 30.0


class Finding(msgspec.Struct, frozen=True, kw_only=True):
    problem: Problem
    verdict: Verdict
    evidence: dict[str, float]
    reason: str


class LinkHealth(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    link_id: str
    last: PortSample | None = None
    # times of up/down transitions inside the flap window
    transitions: list[dt.datetime] = []
    # problem -> when it was last seen (raised problems only)
    active: dict[Problem, dt.datetime] = {}

    @property
    def state(self) -> LinkState:
        """up, down, flapping or degraded: the worst active problem."""
        # A flapping link is also down half the time; "flapping" is the more useful verdict.
        if "flapping" in self.active:
            return "flapping"
        if "down" in self.active:
            return "down"
        return "degraded" if self.active else "up"


def counter_delta(old: int, new: int, bits: int) -> int:
    """new - old, for a counter that may have wrapped at 2**bits or been reset to zero."""
    if new >= old:
        return new - old
    top = (1 << bits) - 1
    if old > top * 0.9:  # it wrapped past its maximum
        return top - old + new + 1
    return new  # it was reset (port reset or a counter clear): count from zero


class PortRates(msgspec.Struct, frozen=True, kw_only=True):
    """A port's rates between two samples while it was up at both."""

    errors_per_s: float  # summed over ERROR_COUNTERS
    congestion_ratio: float | None  # share of time it waited to send (PortXmitWait); None: not reported


_IDLE = PortRates(errors_per_s=0.0, congestion_ratio=None)
_IDLE_WAITING = PortRates(errors_per_s=0.0, congestion_ratio=0.0)


def port_rates(prev: PortSample | None, sample: PortSample) -> PortRates | None:
    """The rates `observe` judges by; None without a previous sample, when the port was down at
    either, or when no time passed."""
    if prev is None or not (prev.up and sample.up):
        return None
    seconds = (sample.at - prev.at).total_seconds()
    if seconds <= 0:
        return None
    # Called for every link every poll. Counters that did not move (most links, most polls): every
    # delta is 0, so the rates are 0.0 (the congestion ratio only where the counter is reported).
    new, old, bits = sample.counters, prev.counters, sample.counter_bits
    if new == old:
        return _IDLE_WAITING if CONGESTION_COUNTER in new else _IDLE
    # Otherwise a plain loop, and counter_delta only for a counter that went backwards (new >= old is
    # the delta counter_delta would return).
    errors = 0
    for c in ERROR_COUNTERS:
        n = new.get(c)
        if n is not None:
            o = old.get(c, 0)
            errors += n - o if n >= o else counter_delta(o, n, bits)
    congestion = None
    n = new.get(CONGESTION_COUNTER)
    if n is not None:
        o = old.get(CONGESTION_COUNTER, 0)
        wait = n - o if n >= o else counter_delta(o, n, bits)
        congestion = wait / seconds / TICKS_PER_SECOND_AT_FULL_WAIT
    return PortRates(errors_per_s=errors / seconds, congestion_ratio=congestion)


def observe(
    health: LinkHealth, sample: PortSample, expected: Expected | None, rules: Rules
) -> tuple[LinkHealth, list[Finding]]:
    return observe_with_rates(health, sample, expected, rules, port_rates(health.last, sample))


def observe_with_rates(
    health: LinkHealth, sample: PortSample, expected: Expected | None, rules: Rules, rates: PortRates | None
) -> tuple[LinkHealth, list[Finding]]:
    """`observe`, given `rates = port_rates(health.last, sample)` (for a caller that keeps them too)."""
    now = sample.at
    prev = health.last
    # Most links, most polls: up before and now, no problem active, no recent transition, running at
    # the expected width and speed, rates under the thresholds. Nothing is found and the new health
    # is the sample alone; the same result as the general path below, without building it.
    if (
        prev is not None
        and prev.up
        and sample.up
        and not health.active
        and not health.transitions
        and rules.flap_changes > 0
        and (
            expected is None
            or (
                (sample.width is None or sample.width >= expected.width)
                and (sample.lane_gbps is None or sample.lane_gbps >= expected.lane_gbps)
            )
        )
        and (
            rates is None
            or (
                rates.errors_per_s <= rules.errors_per_s
                and (rates.congestion_ratio is None or rates.congestion_ratio <= rules.congestion_ratio)
            )
        )
    ):
        # The empty transitions and problems are passed on, not made anew: nothing changes them in
        # place (the general path builds new ones), and no container is allocated per link per poll.
        return LinkHealth(link_id=health.link_id, last=sample, transitions=health.transitions, active=health.active), []
    seen: dict[Problem, tuple[dict[str, float], str]] = {}
    transitions = [t for t in health.transitions if (now - t).total_seconds() <= rules.flap_window_s]
    if prev is not None and prev.up != sample.up:
        transitions.append(now)
    if not sample.up:
        seen["down"] = ({}, "port is not active")
    if len(transitions) >= rules.flap_changes:
        seen["flapping"] = (
            {"changes": float(len(transitions)), "window_s": rules.flap_window_s},
            f"{len(transitions)} state changes within {rules.flap_window_s:.0f} s",
        )
    if sample.up and expected is not None:
        if sample.width is not None and sample.width < expected.width:
            seen["degraded_width"] = (
                {"width": float(sample.width), "expected_width": float(expected.width)},
                f"running {sample.width}x, expected {expected.width}x",
            )
        if sample.lane_gbps is not None and sample.lane_gbps < expected.lane_gbps:
            seen["degraded_speed"] = (
                {"lane_gbps": sample.lane_gbps, "expected_lane_gbps": expected.lane_gbps},
                f"running {sample.lane_gbps:g} Gb/s per lane, expected {expected.lane_gbps:g}",
            )
    if rates is not None:
        if rates.errors_per_s > rules.errors_per_s:
            seen["errors"] = (
                {"errors_per_s": rates.errors_per_s},
                f"{rates.errors_per_s:.1f} errors/s (threshold {rules.errors_per_s:g})",
            )
        ratio = rates.congestion_ratio
        if ratio is not None and ratio > rules.congestion_ratio:
            seen["congested"] = ({"xmit_wait_ratio": ratio}, f"waiting to send {ratio:.0%} of the time")
    findings: list[Finding] = []
    active = dict(health.active)
    for problem, (evidence, reason) in seen.items():
        if problem not in active:
            findings.append(Finding(problem=problem, verdict="raised", evidence=evidence, reason=reason))
        active[problem] = now
    for gone, last_seen in list(active.items()):
        if gone in seen:
            continue
        quiet = (now - last_seen).total_seconds()
        # A port that is active again is no longer down; other problems must stay away a while.
        if quiet >= rules.clear_after_s or gone == "down":
            del active[gone]
            findings.append(
                Finding(problem=gone, verdict="cleared", evidence={"quiet_s": quiet}, reason=f"{gone} cleared")
            )
    return LinkHealth(link_id=health.link_id, last=sample, transitions=transitions, active=active), findings


class _Common(TypedDict):
    id: str
    source: str
    key: str
    occurred_at: dt.datetime
    link_id: str
    topology_version: int


def link_events(
    before: LinkHealth,
    after: LinkHealth,
    findings: list[Finding],
    *,
    topology_version: int,
    source: str,
) -> list[Event]:
    """The events that tell the cluster what `observe` found: a state change, then one event per finding."""
    assert after.last is not None
    if not findings and before.state == after.state:
        return []  # nothing to tell (most links, most polls)
    now = after.last.at
    link = after.link_id
    ids = EventIds(now)
    cause = f"link/{before.state}->{after.state}/{msgspec.json.encode(after.last).decode()}"

    def common() -> _Common:
        return _Common(
            id=ids.next(cause),
            source=source,
            key=link,
            occurred_at=now,
            link_id=link,
            topology_version=topology_version,
        )

    events: list[Event] = []
    if before.state != after.state:
        reasons = "; ".join(f.reason for f in findings) or "no active problem"
        evidence = {k: v for f in findings for k, v in f.evidence.items()}
        events.append(
            LinkStateChanged(
                **common(), state=after.state, previous_state=before.state, reason=reasons, evidence=evidence
            )
        )
    for f in findings:
        if f.verdict == "cleared":
            events.append(LinkRecovered(**common(), problem=f.problem, quiet_s=f.evidence.get("quiet_s", 0.0)))
        elif f.problem == "flapping":
            events.append(LinkFlapping(**common(), changes=int(f.evidence["changes"]), window_s=f.evidence["window_s"]))
        elif f.problem != "down":
            events.append(LinkDegraded(**common(), problem=f.problem, evidence=f.evidence, reason=f.reason))
    return events
