import datetime as dt

from ibpool_core.fabric.link_health import (
    Expected,
    LinkHealth,
    PortSample,
    Rules,
    counter_delta,
    link_events,
    observe,
)

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
NDR4 = Expected(width=4, lane_gbps=100.0)
RULES = Rules(flap_changes=3, flap_window_s=60, errors_per_s=1.0, congestion_ratio=0.5, clear_after_s=30)


def sample(t: float, up: bool = True, width: int = 4, lane: float = 100.0, **counters: int) -> PortSample:
    return PortSample(
        link_id="L", at=T0 + dt.timedelta(seconds=t), up=up, width=width, lane_gbps=lane, counters=counters
    )


def run(samples: list[PortSample]) -> tuple[LinkHealth, list[tuple[float, str, str]]]:
    health = LinkHealth(link_id="L")
    out = []
    for s in samples:
        health, findings = observe(health, s, NDR4, RULES)
        out += [((s.at - T0).total_seconds(), f.problem, f.verdict) for f in findings]
    return health, out


def test_healthy_link_says_nothing() -> None:
    health, found = run([sample(t, symbol_error=0) for t in range(0, 100, 5)])
    assert found == [] and health.state == "up"


def test_down_then_up_raises_and_clears() -> None:
    health, found = run([sample(0), sample(5, up=False), sample(10, up=False), sample(15)])
    assert found == [(5, "down", "raised"), (15, "down", "cleared")]
    assert health.state == "up"


def test_flapping_is_raised_once_and_cleared_after_a_quiet_window() -> None:
    samples = [sample(t, up=(t // 5) % 2 == 0) for t in range(0, 40, 5)] + [sample(t) for t in range(40, 140, 5)]
    health, found = run(samples)
    # changes at 5..40; three of them stay inside the 60 s window until t=90; 30 s quiet after that
    assert [f for f in found if f[1] == "flapping"] == [(15, "flapping", "raised"), (120, "flapping", "cleared")]
    assert health.state == "up"


def test_error_rate_over_threshold_then_clean_for_the_clear_window() -> None:
    counts = [0, 0, 50, 100, 150, 150, 150, 150, 150, 150, 150, 150]
    _, found = run([sample(t * 10, symbol_error=c) for t, c in enumerate(counts)])
    assert found == [(20, "errors", "raised"), (70, "errors", "cleared")]


def test_degraded_width_and_speed_are_seen() -> None:
    health, found = run([sample(0), sample(5, width=1), sample(10, width=1, lane=50.0)])
    assert found == [(5, "degraded_width", "raised"), (10, "degraded_speed", "raised")]
    assert health.state == "degraded"


def test_congestion_from_xmit_wait() -> None:
    _, found = run([sample(0, port_xmit_wait=0), sample(10, port_xmit_wait=int(0.8e9))])
    assert found == [(10, "congested", "raised")]


def test_counter_wrap_and_reset() -> None:
    assert counter_delta(10, 15, 32) == 5
    assert counter_delta(2**32 - 3, 2, 32) == 5  # wrapped
    assert counter_delta(1000, 7, 32) == 7  # reset to zero, then counted 7


def test_reset_counter_does_not_look_like_an_error_burst() -> None:
    _, found = run([sample(0, symbol_error=5000), sample(10, symbol_error=3)])
    assert found == []


def test_findings_become_events_with_state_changes_and_recoveries() -> None:
    from ibpool_proto.fabric import LinkDegraded, LinkFlapping, LinkRecovered, LinkStateChanged

    kinds: list[tuple[str, str]] = []
    health = LinkHealth(link_id="L")
    samples = [sample(0), sample(5, width=1), sample(10, up=False), sample(15, width=1)] + [
        sample(t) for t in range(20, 80, 5)
    ]
    for s in samples:
        after, findings = observe(health, s, NDR4, RULES)
        for e in link_events(health, after, findings, topology_version=3, source="fm"):
            assert e.key == "L" and e.topology_version == 3  # type: ignore[attr-defined]
            match e:
                case LinkStateChanged():
                    kinds.append(("state", f"{e.previous_state}->{e.state}"))
                case LinkDegraded():
                    kinds.append(("degraded", str(e.problem)))
                case LinkRecovered():
                    kinds.append(("recovered", e.problem))
                case LinkFlapping():
                    kinds.append(("flapping", str(e.changes)))
        health = after
    assert kinds == [
        ("state", "up->degraded"),
        ("degraded", "degraded_width"),
        ("state", "degraded->down"),
        ("state", "down->degraded"),
        ("recovered", "down"),
        ("state", "degraded->up"),
        ("recovered", "degraded_width"),
    ]
