"""The fast paths of `link_health` (an idle port's rates, a quiet link's `observe`, no events when
nothing changed) against the general code they skip, kept here as it was before them: on random
walks of links through every state, the same rates, healths, findings and events."""

import datetime as dt
import random
from typing import TypedDict

import msgspec
import pytest

from ibpool_core.fabric.link_health import (
    CONGESTION_COUNTER,
    ERROR_COUNTERS,
    TICKS_PER_SECOND_AT_FULL_WAIT,
    Expected,
    Finding,
    LinkHealth,
    PortRates,
    PortSample,
    Problem,
    Rules,
    counter_delta,
    link_events,
    observe,
    observe_with_rates,
    port_rates,
)
from ibpool_core.ids import EventIds
from ibpool_proto.fabric import LinkDegraded, LinkFlapping, LinkRecovered, LinkStateChanged
from ibpool_proto.message import Event


def ref_port_rates(prev: PortSample | None, sample: PortSample) -> PortRates | None:
    """The rates `observe` judges by; None without a previous sample, when the port was down at
    either, or when no time passed."""
    if prev is None or not (prev.up and sample.up):
        return None
    seconds = (sample.at - prev.at).total_seconds()
    if seconds <= 0:
        return None
    errors = sum(
        counter_delta(prev.counters.get(c, 0), sample.counters.get(c, 0), sample.counter_bits)
        for c in ERROR_COUNTERS
        if c in sample.counters
    )
    congestion = None
    if CONGESTION_COUNTER in sample.counters:
        wait = counter_delta(
            prev.counters.get(CONGESTION_COUNTER, 0), sample.counters[CONGESTION_COUNTER], sample.counter_bits
        )
        congestion = wait / seconds / TICKS_PER_SECOND_AT_FULL_WAIT
    return PortRates(errors_per_s=errors / seconds, congestion_ratio=congestion)


def ref_observe(
    health: LinkHealth, sample: PortSample, expected: Expected | None, rules: Rules
) -> tuple[LinkHealth, list[Finding]]:
    now = sample.at
    seen: dict[Problem, tuple[dict[str, float], str]] = {}
    prev = health.last
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
    rates = ref_port_rates(prev, sample)
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


def ref_link_events(
    before: LinkHealth,
    after: LinkHealth,
    findings: list[Finding],
    *,
    topology_version: int,
    source: str,
) -> list[Event]:
    """The events that tell the cluster what `observe` found: a state change, then one event per finding."""
    assert after.last is not None
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


T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
RULE_SETS = [
    Rules(),
    Rules(flap_changes=3, flap_window_s=60, errors_per_s=1.0, congestion_ratio=0.5, clear_after_s=30),
    Rules(flap_changes=0, errors_per_s=0.0, congestion_ratio=0.0, clear_after_s=0.0),
    Rules(flap_changes=1, flap_window_s=5, errors_per_s=10.0, congestion_ratio=1.0, clear_after_s=10),
]


def _step(rng: random.Random, prev: PortSample | None, t: float) -> PortSample:
    """The link's next sample: mostly idle and up, sometimes down, degraded, erroring, wrapped or reset."""
    counters = dict(prev.counters) if prev is not None else {}
    r = rng.random()
    if r < 0.5:
        pass  # idle: no counter moved
    elif r < 0.7:
        c = rng.choice([*ERROR_COUNTERS, CONGESTION_COUNTER])
        counters[c] = counters.get(c, 0) + rng.choice([1, 2, 5, 6, 7, 10, 50, 1000, 10**7, 6 * 10**8, 10**9])
    elif r < 0.8:
        counters.pop(rng.choice([*ERROR_COUNTERS, CONGESTION_COUNTER]), None)
    elif r < 0.9:
        c = rng.choice(ERROR_COUNTERS)
        counters[c] = rng.choice([0, 3, 2**32 - 2, 2**64 - 2])  # reset or near the top (wraps next)
    bits = 32 if prev is not None and prev.counter_bits == 32 else rng.choice([64, 64, 32])
    return PortSample(
        link_id="L",
        at=T0 + dt.timedelta(seconds=t),
        up=rng.random() > 0.1,
        width=rng.choice([4, 4, 4, 2, 1, None, 8]),
        lane_gbps=rng.choice([100.0, 100.0, 50.0, 200.0, None, float("nan")]),
        counters=counters,
        counter_bits=bits,
    )


@pytest.mark.parametrize("seed", range(40))
def test_fast_paths_give_what_the_general_code_gives(seed: int) -> None:
    rng = random.Random(seed)
    rules = RULE_SETS[seed % len(RULE_SETS)]
    expected = rng.choice([Expected(width=4, lane_gbps=100.0), Expected(width=1, lane_gbps=25.0), None])
    health = ref_health = LinkHealth(link_id="L")
    t = 0.0
    prev: PortSample | None = None
    for _ in range(300):
        t += rng.choice([5.0, 5.0, 5.0, 1.0, 0.0, 60.0, -1.0])
        s = _step(rng, prev, t) if rng.random() < 0.3 or prev is None else _idle(prev, t)
        assert port_rates(health.last, s) == ref_port_rates(health.last, s)
        after, findings = observe(health, s, expected, rules)
        ref_after, ref_findings = ref_observe(ref_health, s, expected, rules)
        assert msgspec.json.encode(after) == msgspec.json.encode(ref_after)
        assert after == ref_after and findings == ref_findings
        rated = observe_with_rates(health, s, expected, rules, port_rates(health.last, s))
        assert rated == (after, findings)
        events = link_events(health, after, findings, topology_version=3, source="fm")
        assert events == ref_link_events(ref_health, ref_after, ref_findings, topology_version=3, source="fm")
        health, ref_health, prev = after, ref_after, s


def _idle(prev: PortSample, t: float) -> PortSample:
    """The same port read again later: up, the same rate and counters (most links, most polls)."""
    return msgspec.structs.replace(prev, at=T0 + dt.timedelta(seconds=t), up=True)


def test_a_quiet_link_keeps_its_empty_transitions_and_problems() -> None:
    s0 = PortSample(link_id="L", at=T0, up=True, width=4, lane_gbps=100.0, counters={"symbol_error": 1})
    s1 = msgspec.structs.replace(s0, at=T0 + dt.timedelta(seconds=5))
    before, _ = observe(LinkHealth(link_id="L"), s0, None, Rules())
    after, findings = observe(before, s1, None, Rules())
    assert findings == [] and after.last is s1 and after.state == "up"
    assert after.transitions is before.transitions and after.active is before.active
    assert port_rates(s0, s1) == PortRates(errors_per_s=0.0, congestion_ratio=None)
    s2 = msgspec.structs.replace(
        s1, at=T0 + dt.timedelta(seconds=10), counters={"symbol_error": 1, CONGESTION_COUNTER: 0}
    )
    s3 = msgspec.structs.replace(s2, at=T0 + dt.timedelta(seconds=15))
    assert port_rates(s2, s3) == PortRates(errors_per_s=0.0, congestion_ratio=0.0)


def test_no_fast_path_when_every_link_counts_as_flapping() -> None:
    """flap_changes=0: no change at all is already "flapping", even on a quiet link."""
    s0 = PortSample(link_id="L", at=T0, up=True, width=4, lane_gbps=100.0)
    s1 = msgspec.structs.replace(s0, at=T0 + dt.timedelta(seconds=5))
    rules = Rules(flap_changes=0)
    quiet = LinkHealth(link_id="L", last=s0)
    assert observe(quiet, s1, None, rules) == ref_observe(quiet, s1, None, rules)
    assert observe(quiet, s1, None, rules)[0].state == "flapping"
