"""act(): operator actions on the health picture, table-driven, then through decide() over time."""

from __future__ import annotations

import datetime as dt

import msgspec
import pytest

from ibpool_core.health.decide import (
    FailoverConfig,
    FailoverRequest,
    GpuHealth,
    HealthState,
    Holding,
    JobRecord,
    NodeHealth,
    decide,
)
from ibpool_core.health.heartbeat import HeartbeatRules
from ibpool_core.health.operator import (
    CordonNode,
    DrainNode,
    OperatorAction,
    OperatorRequest,
    RecoverGpu,
    RecoverNode,
    UncordonNode,
    act,
)
from ibpool_proto.health import (
    Cordoned,
    DrainRequested,
    GpuFailed,
    GpuRecovered,
    NodeFailed,
    NodeRecovered,
    RequeueRequested,
    Uncordoned,
)
from ibpool_proto.message import Event
from ibpool_proto.node import GpuInfo, GpuSample, NodeHeartbeat, NodeRegistered, TelemetryReported

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
NOW = T0 + dt.timedelta(seconds=100)
CONFIG = FailoverConfig(
    source="test",
    heartbeat=HeartbeatRules(suspect_after_intervals=2.5, fail_after_s=3.0, clear_after_beats=3),
    stable_window_s=10.0,
)
WHY = "ops: GPU reseated, ticket 42"


def node(**kw: object) -> NodeHealth:
    base: dict[str, object] = {"node_id": "n1", "since": T0, "last_beat": NOW, "gpu_count": 4}
    return NodeHealth(**{**base, **kw})  # type: ignore[arg-type]


FAILED_GPU = GpuHealth(index=1, failed=True, cordoned=True, reason="XID 48", xid=48)
HOT_GPU = GpuHealth(index=2, cordoned=True, reason="hot")
FAILED_NODE = node(
    status="failed", reason="XID 79", cordoned=True, needs_reboot=True, failures=2, last_failed_at=T0, hold_s=20.0
)
SUSPECT_NODE = node(status="suspect", reason="late")
DRAINED_NODE = node(cordoned=True, operator_drain="ops: bios update")
CORDONED_NODE = node(cordoned=True, operator_cordon="ops: watch it")
CORDONED_GPU = GpuHealth(index=3, cordoned=True, operator_cordon="ops: fan noise")
HOLDINGS = {
    "a1/n1": Holding(allocation_id="a1", job_id="j1", node_id="n1", gpu_indices=[0, 1]),
    "a2/n1": Holding(allocation_id="a2", job_id="j2", node_id="n1", gpu_indices=[2]),
    "a2/n2": Holding(allocation_id="a2", job_id="j2", node_id="n2", gpu_indices=[0]),
    "a3/n2": Holding(allocation_id="a3", job_id="j3", node_id="n2", gpu_indices=[1]),
}


def summary(events: list[Event]) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = []
    for e in events:
        match e:
            case GpuRecovered() | Cordoned() | DrainRequested():
                where = f"gpu{e.gpu_index}" if isinstance(e, GpuRecovered) else getattr(e, "scope", "")
                out.append((type(e).__name__, where))
            case Uncordoned():
                out.append(("Uncordoned", e.scope if e.gpu_index is None else f"gpu{e.gpu_index}"))
            case RequeueRequested():
                out.append(("RequeueRequested", e.job_id))
            case _:
                out.append((type(e).__name__,))
    return out


CASES: list[tuple[str, NodeHealth, OperatorAction, str, list[tuple[str, ...]]]] = [
    (
        "failed GPU: recovered and uncordoned",
        node(gpus={1: FAILED_GPU}),
        RecoverGpu(node_id="n1", gpu_index=1, reason=WHY),
        "done",
        [("GpuRecovered", "gpu1"), ("Uncordoned", "gpu1")],
    ),
    (
        "cordoned (hot) GPU: uncordoned only",
        node(gpus={2: HOT_GPU}),
        RecoverGpu(node_id="n1", gpu_index=2, reason=WHY),
        "done",
        [("Uncordoned", "gpu2")],
    ),
    (
        "healthy GPU: nothing to do",
        node(gpus={1: FAILED_GPU}),
        RecoverGpu(node_id="n1", gpu_index=0, reason=WHY),
        "nothing_to_do",
        [],
    ),
    ("GPU past the inventory", node(), RecoverGpu(node_id="n1", gpu_index=4, reason=WHY), "not_found", []),
    ("negative GPU index", node(), RecoverGpu(node_id="n1", gpu_index=-1, reason=WHY), "not_found", []),
    ("unknown node", node(), RecoverGpu(node_id="n9", gpu_index=0, reason=WHY), "not_found", []),
    (
        "failed node: recovered and uncordoned",
        FAILED_NODE,
        RecoverNode(node_id="n1", reason=WHY),
        "done",
        [("NodeRecovered",), ("Uncordoned", "node")],
    ),
    ("suspected node: recovered", SUSPECT_NODE, RecoverNode(node_id="n1", reason=WHY), "done", [("NodeRecovered",)]),
    ("drained node: uncordoned", DRAINED_NODE, RecoverNode(node_id="n1", reason=WHY), "done", [("Uncordoned", "node")]),
    ("healthy node: nothing to do", node(), RecoverNode(node_id="n1", reason=WHY), "nothing_to_do", []),
    ("recover unknown node", node(), RecoverNode(node_id="n9", reason=WHY), "not_found", []),
    (
        "healthy node: cordoned, drained, each allocation there requeued once",
        node(),
        DrainNode(node_id="n1", reason=WHY),
        "done",
        [("Cordoned", "node"), ("DrainRequested", ""), ("RequeueRequested", "j1"), ("RequeueRequested", "j2")],
    ),
    (
        "failed node: already cordoned, drain held",
        FAILED_NODE,
        DrainNode(node_id="n1", reason=WHY),
        "done",
        [("DrainRequested", ""), ("RequeueRequested", "j2")],
    ),
    ("drained node: nothing to do", DRAINED_NODE, DrainNode(node_id="n1", reason=WHY), "nothing_to_do", []),
    ("drain unknown node", node(), DrainNode(node_id="n9", reason=WHY), "not_found", []),
    ("healthy node: cordoned, work stays", node(), CordonNode(node_id="n1", reason=WHY), "done",
     [("Cordoned", "node")]),
    ("failed node: cordon taken over quietly", FAILED_NODE, CordonNode(node_id="n1", reason=WHY), "done", []),
    ("cordoned node: nothing to do", CORDONED_NODE, CordonNode(node_id="n1", reason=WHY), "nothing_to_do", []),
    ("GPU: cordoned, work stays", node(), CordonNode(node_id="n1", gpu_index=0, reason=WHY), "done",
     [("Cordoned", "gpu")]),
    ("hot GPU: cordon kept by the operator", node(gpus={2: HOT_GPU}), CordonNode(node_id="n1", gpu_index=2, reason=WHY),
     "done", []),
    ("cordon GPU past the inventory", node(), CordonNode(node_id="n1", gpu_index=4, reason=WHY), "not_found", []),
    ("cordon unknown node", node(), CordonNode(node_id="n9", reason=WHY), "not_found", []),
    ("cordoned node: uncordoned", CORDONED_NODE, UncordonNode(node_id="n1", reason=WHY), "done",
     [("Uncordoned", "node")]),
    ("cordoned and failed node: operator's cordon lifted, failure's stays",
     msgspec.structs.replace(FAILED_NODE, operator_cordon="ops"), UncordonNode(node_id="n1", reason=WHY), "done", []),
    ("drained node: uncordon has nothing to do", DRAINED_NODE, UncordonNode(node_id="n1", reason=WHY),
     "nothing_to_do", []),
    ("node not cordoned: nothing to do", node(), UncordonNode(node_id="n1", reason=WHY), "nothing_to_do", []),
    ("cordoned GPU: uncordoned", node(gpus={3: CORDONED_GPU}), UncordonNode(node_id="n1", gpu_index=3, reason=WHY),
     "done", [("Uncordoned", "gpu3")]),
    ("hot GPU: uncordon has nothing of the operator's to lift", node(gpus={2: HOT_GPU}),
     UncordonNode(node_id="n1", gpu_index=2, reason=WHY), "nothing_to_do", []),
    ("operator-cordoned GPU: recovered clears it", node(gpus={3: CORDONED_GPU}),
     RecoverGpu(node_id="n1", gpu_index=3, reason=WHY), "done", [("Uncordoned", "gpu3")]),
    ("operator-cordoned node: resumed", CORDONED_NODE, RecoverNode(node_id="n1", reason=WHY), "done",
     [("Uncordoned", "node")]),
]  # fmt: skip


@pytest.mark.parametrize(("name", "before", "action", "outcome", "events"), CASES, ids=[c[0] for c in CASES])
def test_operator_action(
    name: str, before: NodeHealth, action: OperatorAction, outcome: str, events: list[tuple[str, ...]]
) -> None:
    # j1's allocation on n1 was already requeued by a failure: a drain of a failed node does not repeat it.
    jobs = {"j1": JobRecord(job_id="j1", failures=1, counted=["a1"])} if before is FAILED_NODE else {}
    state = HealthState(nodes={"n1": before}, holdings=HOLDINGS, jobs=jobs)
    reply = act(OperatorRequest(state=state, now=NOW, action=action, config=CONFIG))
    assert reply.outcome == outcome, reply.detail
    assert summary(reply.events) == events
    assert reply.detail
    if outcome != "done":
        assert reply.state == state
        return
    for e in reply.events:
        if isinstance(e, GpuRecovered | NodeRecovered | Uncordoned | Cordoned | DrainRequested):
            assert e.reason == WHY, e
        assert e.source == "test" and e.occurred_at == NOW
    # Idempotent: the same action again has nothing to do.
    again = act(OperatorRequest(state=reply.state, now=NOW, action=action, config=CONFIG))
    assert (again.outcome, again.events) == ("nothing_to_do", []), again.detail


def test_a_recovered_gpu_leaves_the_picture_and_the_node_keeps_its_other_verdicts() -> None:
    state = HealthState(nodes={"n1": node(gpus={1: FAILED_GPU, 2: HOT_GPU})})
    reply = act(OperatorRequest(state=state, now=NOW, action=RecoverGpu(node_id="n1", gpu_index=1, reason=WHY)))
    assert sorted(reply.state.nodes["n1"].gpus) == [2]


def test_a_recovered_node_gets_a_fresh_window_keeps_its_failure_count_and_fails_again_when_silent() -> None:
    state = HealthState(nodes={"n1": msgspec.structs.replace(FAILED_NODE, last_beat=T0)})
    reply = act(OperatorRequest(state=state, now=NOW, action=RecoverNode(node_id="n1", reason=WHY), config=CONFIG))
    n = reply.state.nodes["n1"]
    assert (n.status, n.cordoned, n.needs_reboot, n.last_beat, n.failures) == ("healthy", False, False, NOW, 2)
    later = NOW + dt.timedelta(seconds=2)
    quiet = decide(FailoverRequest(state=reply.state, now=later, config=CONFIG))
    assert not [e for e in quiet.events if isinstance(e, NodeFailed)], "a fresh window, not the old silence"
    silent = decide(FailoverRequest(state=quiet.state, now=NOW + dt.timedelta(seconds=4), config=CONFIG))
    assert [type(e) for e in silent.events if isinstance(e, NodeFailed)] == [NodeFailed]
    # The third failure inside the flap memory: held four times the stable window.
    assert silent.state.nodes["n1"].hold_s == 4 * CONFIG.stable_window_s


def beating_again(state: HealthState, t: dt.datetime) -> tuple[HealthState, list[Event], dt.datetime]:
    """n1 beating every second after `t`, longer than the stable window: the state, the events, the time."""
    events: list[Event] = []
    now = t
    for k in range(1, 40):
        now = t + dt.timedelta(seconds=k)
        beat = NodeHeartbeat(source="n1", key="n1", node_id="n1", occurred_at=now, seq=k, interval_s=1.0)
        r = decide(FailoverRequest(state=state, now=now, observations=[beat], config=CONFIG))
        state, events = r.state, [*events, *r.events]
    return state, events, now


def test_an_operator_drain_outlives_a_failure_and_its_automatic_recovery() -> None:
    state = HealthState(nodes={"n1": node(last_beat=NOW)})
    drained = act(OperatorRequest(state=state, now=NOW, action=DrainNode(node_id="n1", reason=WHY), config=CONFIG))
    t = NOW + dt.timedelta(seconds=5)  # silent: failed
    s = decide(FailoverRequest(state=drained.state, now=t, config=CONFIG))
    assert any(isinstance(e, NodeFailed) for e in s.events)
    assert not any(isinstance(e, Cordoned) for e in s.events), "already cordoned by the operator"
    # Beats again, for longer than the stable window: NodeRecovered, but the node cordon stays.
    state2, events, now = beating_again(s.state, t)
    assert any(isinstance(e, NodeRecovered) for e in events)
    assert not any(isinstance(e, Uncordoned) for e in events)
    n = state2.nodes["n1"]
    assert (n.status, n.cordoned, n.operator_drain) == ("healthy", True, WHY)
    back = act(OperatorRequest(state=state2, now=now, action=RecoverNode(node_id="n1", reason=WHY), config=CONFIG))
    assert summary(back.events) == [("Uncordoned", "node")]
    assert not back.state.nodes["n1"].cordoned


def test_registration_records_the_gpu_count_an_action_is_checked_against() -> None:
    gpus = [GpuInfo(index=i, uuid=f"G{i}", model="H100", memory_mib=80_000) for i in range(2)]
    reg = NodeRegistered(
        source="n1",
        key="n1",
        node_id="n1",
        hostname="n1",
        cpu_milli=1,
        memory_mib=1,
        gpus=gpus,
        occurred_at=NOW,
        backend="test",
    )
    s = decide(FailoverRequest(state=HealthState(), now=NOW, observations=[reg], config=CONFIG)).state
    assert s.nodes["n1"].gpu_count == 2
    reply = act(OperatorRequest(state=s, now=NOW, action=RecoverGpu(node_id="n1", gpu_index=2, reason=WHY)))
    assert reply.outcome == "not_found" and "GPUs 0..1" in reply.detail


def test_a_replayed_sample_does_not_fail_what_an_operator_recovered() -> None:
    def sample(at: dt.datetime, xid: int) -> TelemetryReported:
        gpus = [
            GpuSample(index=i, uuid=f"G{i}", utilization_pct=0, memory_used_mib=0, temperature_c=40, power_w=1,
                      xids=[xid] if i == 1 else [])
            for i in range(4)
        ]  # fmt: skip
        return TelemetryReported(source="n1", key="n1", node_id="n1", gpus=gpus, occurred_at=at)

    state = HealthState(nodes={"n1": node()})
    xid48 = sample(NOW, 48)
    hit = decide(FailoverRequest(state=state, now=NOW, observations=[xid48], config=CONFIG))
    assert any(isinstance(e, GpuFailed) for e in hit.events)
    back = act(OperatorRequest(state=hit.state, now=NOW, action=RecoverGpu(node_id="n1", gpu_index=1, reason=WHY)))
    later = NOW + dt.timedelta(seconds=1)
    replay = decide(FailoverRequest(state=back.state, now=later, observations=[xid48], config=CONFIG))
    assert replay.events == [] and replay.state.nodes["n1"].gpus == {}
    assert any("judged already" in note for note in replay.notes)
    fresh = decide(FailoverRequest(state=replay.state, now=later, observations=[sample(later, 48)], config=CONFIG))
    assert any(isinstance(e, GpuFailed) for e in fresh.events), "a new XID after the recovery fails it again"


def test_an_operator_cordon_keeps_the_work_there_and_outlives_a_failure_and_its_recovery() -> None:
    state = HealthState(nodes={"n1": node(last_beat=NOW)}, holdings=HOLDINGS)
    cordoned = act(OperatorRequest(state=state, now=NOW, action=CordonNode(node_id="n1", reason=WHY), config=CONFIG))
    assert not [e for e in cordoned.events if isinstance(e, RequeueRequested | DrainRequested)]
    assert cordoned.state.holdings == HOLDINGS
    t = NOW + dt.timedelta(seconds=5)  # silent: failed
    s = decide(FailoverRequest(state=cordoned.state, now=t, config=CONFIG))
    assert any(isinstance(e, NodeFailed) for e in s.events)
    state2, events, now = beating_again(s.state, t)
    assert any(isinstance(e, NodeRecovered) for e in events)
    assert not any(isinstance(e, Uncordoned) for e in events)
    assert (state2.nodes["n1"].cordoned, state2.nodes["n1"].operator_cordon) == (True, WHY)
    back = act(OperatorRequest(state=state2, now=now, action=UncordonNode(node_id="n1", reason=WHY), config=CONFIG))
    assert summary(back.events) == [("Uncordoned", "node")]
    assert not back.state.nodes["n1"].cordoned


def test_an_operator_gpu_cordon_outlives_good_samples_and_a_re_registration() -> None:
    state = HealthState(nodes={"n1": node()})
    c = act(
        OperatorRequest(state=state, now=NOW, action=CordonNode(node_id="n1", gpu_index=1, reason=WHY), config=CONFIG)
    )
    gpus = [GpuInfo(index=i, uuid=f"G{i}", model="H100", memory_mib=80_000) for i in range(4)]
    reg = NodeRegistered(
        source="n1", key="n1", node_id="n1", hostname="n1", cpu_milli=1, memory_mib=1, gpus=gpus,
        occurred_at=NOW + dt.timedelta(seconds=1), backend="test",
    )  # fmt: skip
    state2, events = c.state, []
    for k in range(1, 30):
        at = NOW + dt.timedelta(seconds=k)
        samples = [
            GpuSample(index=i, uuid=f"G{i}", utilization_pct=0, memory_used_mib=0, temperature_c=40, power_w=1)
            for i in range(4)
        ]
        obs = [TelemetryReported(source="n1", key="n1", node_id="n1", gpus=samples, occurred_at=at)]
        r = decide(FailoverRequest(state=state2, now=at, observations=[reg, *obs] if k == 1 else obs, config=CONFIG))
        state2, events = r.state, [*events, *r.events]
    assert not any(isinstance(e, Uncordoned) for e in events), events
    assert state2.nodes["n1"].gpus[1].operator_cordon == WHY
    assert state2.nodes["n1"].gpus[1].cordoned
