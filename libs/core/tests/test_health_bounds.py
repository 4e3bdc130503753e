"""The failover decision's work per tick is bounded by what changed, not by the cluster.

With the caller's `Watch`, a tick over a cluster whose nodes all beat on time judges no node and
reports no change to store, whatever the cluster's size; a stopped agent's nodes are the only ones
judged; and the watch is built from every node once, not per tick. (That the watch never changes a
decision is checked on every decision of the scenario tests, `health_twin.Twin`.)
"""

from __future__ import annotations

import msgspec

from ibpool_core.health.decide import FailoverReply, FailoverRequest, HealthState, Watch, decide
from ibpool_core.health.heartbeat import HeartbeatRules
from ibpool_proto.node import NodeHeartbeat, TelemetryReported

from .test_health_decide import CONFIG, at, beat, registered, telemetry

NODES = 2_000


def _run(
    state: HealthState, watch: Watch, t0: float, seconds: float, nodes: list[str], stopped: frozenset[str] = frozenset()
) -> tuple[HealthState, list[int], list[int]]:
    """Tick every 0.25 s, every node not stopped beating each second and sending telemetry every 5 s;
    per tick: how many nodes were judged, how many state entries changed."""
    judged: list[int] = []
    changed: list[int] = []
    t = t0
    while t < t0 + seconds - 1e-9:
        t = round(t + 0.25, 6)
        obs: list[NodeHeartbeat | TelemetryReported] = []
        if t == int(t):
            obs += [beat(n, t) for n in nodes if n not in stopped]
        if t % 5 == 0:
            obs += [telemetry(n, t, 0) for n in nodes if n not in stopped]
        reply = decide(FailoverRequest(state=state, now=at(t), observations=list(obs), config=CONFIG), watch)
        state = reply.state
        judged.append(watch.judged)
        c = reply.changes
        changed.append(len(c.nodes) + len(c.holdings) + len(c.jobs) + len(c.departed) + len(c.finished))
    return state, judged, changed


def _registered(count: int) -> tuple[list[str], Watch, FailoverReply]:
    """`count` nodes registered at t=0, the watch that saw it, and the reply."""
    nodes = [f"n{i:05d}" for i in range(count)]
    watch = Watch()
    registrations = [registered(n, 0.0) for n in nodes]
    reply = decide(FailoverRequest(state=HealthState(), now=at(0.0), observations=registrations, config=CONFIG), watch)
    return nodes, watch, reply


def test_a_tick_over_a_cluster_beating_on_time_judges_no_node_and_changes_nothing_to_store() -> None:
    nodes, watch, first = _registered(NODES)
    assert len(first.changes.nodes) == NODES  # registrations are changes: stored
    _, judged, changed = _run(first.state, watch, 0.0, 20.0, nodes)
    assert judged == [0] * len(judged)
    assert changed == [0] * len(changed)
    assert watch.builds == 1
    assert len(watch.deadlines) <= 4 * NODES  # a beat's entry, and those of the beats before it not met yet


def test_only_a_silent_agents_nodes_are_judged_and_stored_and_the_others_stay_untouched() -> None:
    nodes, watch, registration = _registered(NODES)
    state = registration.state
    state, _, _ = _run(state, watch, 0.0, 5.0, nodes)
    silent = frozenset(nodes[:3])
    state, judged, changed = _run(state, watch, 5.0, 10.0, nodes, silent)
    assert max(judged) == len(silent)
    assert 0 < max(changed) <= len(silent)
    assert {n for n, h in state.nodes.items() if h.status == "failed"} == silent
    assert watch.builds == 1


def test_a_watch_is_built_anew_for_a_state_it_did_not_see_and_for_another_suspect_window() -> None:
    nodes = [f"n{i}" for i in range(10)]
    watch = Watch()
    state = decide(
        FailoverRequest(
            state=HealthState(), now=at(0.0), observations=[registered(n, 0.0) for n in nodes], config=CONFIG
        ),
        watch,
    ).state
    decide(FailoverRequest(state=state, now=at(0.25), config=CONFIG), watch)
    assert watch.builds == 1
    # The same state again (a decision that was not committed): not the map the watch last saw.
    decide(FailoverRequest(state=state, now=at(0.25), config=CONFIG), watch)
    assert watch.builds == 2
    wider = msgspec.structs.replace(
        CONFIG, heartbeat=HeartbeatRules(suspect_after_intervals=4.0, fail_after_s=6.0, clear_after_beats=3)
    )
    decide(FailoverRequest(state=state, now=at(0.5), config=wider), watch)
    assert watch.builds == 3


def test_a_stall_of_every_node_at_once_sends_two_events_not_two_per_node() -> None:
    """One agent process hosting every node (or the bus) stalls for 3 s: more of the cluster is late at
    once than may fail, so nothing fails, and one ClusterDegraded and one ClusterRestored say so, not a
    NodeSuspected and a NodeRecovered per node (thousands of events in one tick at scale)."""
    nodes, watch, registration = _registered(NODES)
    state = registration.state
    events: list[str] = []
    t = 0.0
    while t < 20.0:
        t = round(t + 0.25, 6)
        stalled = 5.0 < t < 8.5
        obs = [beat(n, t) for n in nodes] if t == int(t) and not stalled else []
        reply = decide(FailoverRequest(state=state, now=at(t), observations=list(obs), config=CONFIG), watch)
        state = reply.state
        events += [type(e).__name__ for e in reply.events]
    assert events == ["ClusterDegraded", "ClusterRestored"]
    assert {h.status for h in state.nodes.values()} == {"healthy"}
