"""Liveness from bus connections: the tracker of open connections and decide()'s connection rule."""

from __future__ import annotations

from ibpool_core.health.connections import (
    ConnectionAdvisory,
    ConnectionClosed,
    ConnectionOpened,
    LiveConnections,
    OpenConnection,
)
from ibpool_core.health.decide import FailoverRequest, HealthState, Observation, restart_grace
from ibpool_proto.health import ClusterDegraded, NodeFailed, NodeRecovered, NodeSuspected, RequeueRequested
from ibpool_proto.message import Event
from ibpool_proto.node import NodeHeartbeat

from .health_twin import Twin
from .test_health_decide import CONFIG, at, granted, registered

AGENT = "agent"


def advisory(kind: str, cid: int, t: float, name: str = AGENT, server: str = "S1") -> ConnectionAdvisory:
    return ConnectionAdvisory(
        id=f"{kind}-{server}-{cid}-{t}", kind=kind, server_id=server, client_id=cid, name=name, at=at(t)
    )  # type: ignore[arg-type]


def test_the_last_connection_of_a_name_closing_is_reported_once_and_its_reopening_once() -> None:
    live = LiveConnections()
    assert live.apply(advisory("connect", 1, 0.0)) is None
    assert live.apply(advisory("connect", 2, 0.0)) is None  # a second connection of the same process
    assert live.apply(advisory("disconnect", 1, 1.0)) is None  # one remains open
    closed = live.apply(advisory("disconnect", 2, 2.0))
    assert isinstance(closed, ConnectionClosed) and closed.source == AGENT and closed.at == at(2.0)
    assert live.apply(advisory("disconnect", 2, 2.0)) is None  # a repeat says nothing new
    opened = live.apply(advisory("connect", 7, 2.5, server="S2"))  # back, through another server
    assert isinstance(opened, ConnectionOpened) and opened.at == at(2.5)
    assert live.apply(advisory("connect", 8, 2.6)) is None
    # Unnamed connections are nobody's.
    assert live.apply(advisory("disconnect", 9, 3.0, name="")) is None


def test_a_close_of_a_connection_never_seen_open_counts_and_the_servers_list_reopens_only_what_it_lists() -> None:
    live = LiveConnections()
    # The controller started after these connected: it learns of them from the servers' list.
    assert (
        live.sync(
            [
                OpenConnection(server_id="S1", client_id=1, name="a"),
                OpenConnection(server_id="S1", client_id=2, name="b"),
            ],
            at(0.0),
        )
        == []
    )
    assert isinstance(live.apply(advisory("disconnect", 1, 1.0, name="a")), ConnectionClosed)
    assert isinstance(live.apply(advisory("disconnect", 5, 1.0, name="c")), ConnectionClosed)  # never listed
    # The controller reconnected: "a" is listed again (its connect advisory was missed), "b" is gone
    # unseen (not reported closed: the heartbeat rule judges it).
    back = live.sync([OpenConnection(server_id="S1", client_id=3, name="a")], at(5.0))
    assert [o.source for o in back] == ["a"]
    assert live.sync([OpenConnection(server_id="S1", client_id=3, name="a")], at(6.0)) == []
    assert live.apply(advisory("disconnect", 2, 7.0, name="b")) is not None  # b's one connection, now closed


class Run:
    """decide() ticking every 0.25 s over nodes whose agents beat every second (unless stopped)."""

    def __init__(self, agents: dict[str, list[str]]) -> None:
        self.agents = agents
        self.stopped: set[str] = set()
        self.log: list[tuple[float, Event]] = []
        self.t = 0.0
        self.twin = Twin()
        first = [registered(n, 0.0) for nodes in agents.values() for n in nodes]
        self.state = HealthState()
        self.tick([msgspec_replace_source(o, a) for a, nodes in agents.items() for o in first if o.node_id in nodes])

    def tick(self, observations: list[Observation], lag_s: float = 0.0) -> None:
        reply = self.twin.decide(
            FailoverRequest(
                state=self.state, now=at(self.t), observations=observations, config=CONFIG, beats_lag_s=lag_s
            )
        )
        self.state = reply.state
        self.log += [(self.t, e) for e in reply.events]

    def run(self, until: float, extra: dict[float, list[Observation]] | None = None, lag_s: float = 0.0) -> None:
        while self.t < until - 1e-9:
            self.t = round(self.t + 0.25, 6)
            obs: list[Observation] = []
            if self.t == int(self.t):
                obs += [
                    beat_from(agent, n, self.t)
                    for agent, nodes in self.agents.items()
                    if agent not in self.stopped
                    for n in nodes
                ]
            obs += (extra or {}).get(self.t, [])
            self.tick(obs, lag_s)

    def events(self, kind: type[Event]) -> list[tuple[float, Event]]:
        return [(t, e) for t, e in self.log if isinstance(e, kind)]


def msgspec_replace_source(o: Observation, source: str) -> Observation:
    import msgspec

    return msgspec.structs.replace(o, source=source)  # type: ignore[type-var]


def beat_from(agent: str, node: str, t: float) -> NodeHeartbeat:
    return NodeHeartbeat(source=agent, key=node, occurred_at=at(t), node_id=node, seq=1, interval_s=1.0)


def closed(agent: str, t: float) -> ConnectionClosed:
    return ConnectionClosed(id=f"close-{agent}-{t}", source=agent, at=at(t))


def opened(agent: str, t: float) -> ConnectionOpened:
    return ConnectionOpened(id=f"open-{agent}-{t}", source=agent, at=at(t))


def agents(count: int, per_agent: int = 2) -> dict[str, list[str]]:
    return {f"node_agent/a{a:02d}": [f"n{a:02d}-{k}" for k in range(per_agent)] for a in range(count)}


def test_a_killed_agents_nodes_fail_after_the_grace_not_the_heartbeat_window_and_their_work_is_requeued() -> None:
    r = Run(agents(10))
    r.tick([granted("alloc-1", "job-1", "n03-0", [0, 1])])
    r.run(5.0)
    r.stopped.add("node_agent/a03")  # SIGKILL just after its beat at t=5: the server sees the close at 5.1
    r.run(8.0, extra={5.25: [closed("node_agent/a03", 5.1)]})
    failed = r.events(NodeFailed)
    assert sorted(e.node_id for _, e in failed) == ["n03-0", "n03-1"]  # type: ignore[attr-defined]
    assert {t for t, _ in failed} == {6.25}  # 1.0 s grace after 5.1, at the next tick; heartbeats alone: 8.0+
    assert all("bus connection closed" in e.reason for _, e in failed)  # type: ignore[attr-defined]
    assert [e.job_id for _, e in r.events(RequeueRequested)] == ["job-1"]  # type: ignore[attr-defined]
    assert all(getattr(e, "node_id", "n03").startswith("n03") for _, e in r.log)


def test_an_agent_that_reconnects_within_the_grace_or_beats_after_the_close_is_not_failed() -> None:
    r = Run(agents(10))
    r.run(5.0)
    # a00: its connection closed and a new one opened 0.4 s later (a NATS server restart of its own).
    # a01: closed, and a beat sent after the close arrives before its connect advisory does.
    r.run(
        9.0,
        extra={
            5.25: [closed("node_agent/a00", 5.1), closed("node_agent/a01", 5.2)],
            5.5: [opened("node_agent/a00", 5.5)],
        },
    )
    assert not r.events(NodeFailed) and not r.events(NodeSuspected)
    assert all(n.connection_closed_at is None for n in r.state.nodes.values())


def test_a_close_arriving_after_a_newer_beat_leaves_the_node_alone() -> None:
    # The agent reconnected to another server and beat before the old server's advisory came through.
    r = Run(agents(3))
    r.run(5.0)
    r.run(8.0, extra={6.25: [closed("node_agent/a01", 5.5)]})
    assert not r.events(NodeFailed) and not r.events(NodeSuspected)


def test_a_hung_agent_keeps_its_connection_and_is_failed_by_the_heartbeat_rule() -> None:
    r = Run(agents(10))
    r.run(5.0)
    r.stopped.add("node_agent/a04")  # SIGSTOP: no beat after 5, the connection stays open
    r.run(10.0)
    failed = r.events(NodeFailed)
    assert sorted(e.node_id for _, e in failed) == ["n04-0", "n04-1"]  # type: ignore[attr-defined]
    assert all("no heartbeat" in e.reason for _, e in failed)  # type: ignore[attr-defined]
    assert {t for t, _ in failed} == {8.25}


def test_a_server_dropping_many_connections_at_once_fails_nobody_and_says_so() -> None:
    r = Run(agents(10))
    r.run(5.0)
    # One NATS server of three went away with 4 of the 10 agents on it (8 of 20 nodes, over the 20%
    # guard); they reconnect elsewhere only after 3 s, one by one.
    dropped = [f"node_agent/a{a:02d}" for a in range(4)]
    r.stopped |= set(dropped)
    extra: dict[float, list[Observation]] = {5.25: [closed(a, 5.1) for a in dropped]}
    for k, a in enumerate(dropped):
        extra.setdefault(8.0 + k * 0.5, []).append(opened(a, 8.0 + k * 0.5))
    r.run(8.0, extra=extra)
    r.stopped -= set(dropped)
    r.run(20.0, extra=extra)
    assert not r.events(NodeFailed)
    assert len(r.events(ClusterDegraded)) == 1
    suspected = {e.node_id for _, e in r.events(NodeSuspected)}  # type: ignore[attr-defined]
    recovered = {e.node_id for _, e in r.events(NodeRecovered)}  # type: ignore[attr-defined]
    assert suspected == recovered == {n for a in dropped for n in r.agents[a]}


def test_a_dead_agent_is_failed_even_when_the_controller_lags_its_heartbeats() -> None:
    # 6 s behind the beats: the heartbeat rule can vouch for no silence yet; the server's word can.
    r = Run(agents(10))
    r.run(5.0, lag_s=6.0)
    r.stopped.add("node_agent/a02")
    r.run(8.0, extra={5.25: [closed("node_agent/a02", 5.1)]}, lag_s=6.0)
    assert sorted(e.node_id for _, e in r.events(NodeFailed)) == ["n02-0", "n02-1"]  # type: ignore[attr-defined]


def test_a_restarted_controller_forgets_closes_it_saw_and_the_heartbeat_rule_takes_over() -> None:
    r = Run(agents(3))
    r.run(5.0)
    r.run(5.5, extra={5.25: [closed("node_agent/a01", 5.1)]})
    assert r.state.nodes["n01-0"].connection_closed_at == at(5.1)
    state = restart_grace(r.state, at(5.5))
    assert all(n.connection_closed_at is None for n in state.nodes.values())
    assert state.nodes["n01-0"].last_beat == at(5.5)


def test_a_dead_agent_is_failed_while_the_guard_holds_back_heartbeats_late_for_a_shared_reason() -> None:
    # Over half the cluster's beats stop coming for 6 s (an overloaded bus): the guard holds those
    # back. An agent that dies meanwhile is failed all the same: its connection closed.
    r = Run(agents(10))
    r.run(5.0)
    slow = {f"node_agent/a{a:02d}" for a in range(6)}
    r.stopped |= slow | {"node_agent/a09"}
    r.run(11.0, extra={7.25: [closed("node_agent/a09", 7.1)]})
    r.stopped -= slow
    r.run(20.0)
    assert sorted(e.node_id for _, e in r.events(NodeFailed)) == ["n09-0", "n09-1"]  # type: ignore[attr-defined]
    assert len(r.events(ClusterDegraded)) == 1
