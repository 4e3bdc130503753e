"""The Slurm bridge's decision (`ibpool_core.slurm_bridge.sync`): requests built by hand, no Slurm."""

from __future__ import annotations

import datetime as dt

import msgspec
import pytest

from ibpool_core.slurm_bridge import (
    BridgeConfig,
    Cordon,
    Drain,
    Refused,
    Resume,
    SlurmNode,
    SyncRequest,
    apply_cordon,
    node_changes,
    parse_scontrol_nodes,
    sync,
    wanted_drains,
)


def idle(name: str) -> SlurmNode:
    return SlurmNode(name=name, state=("IDLE",))


def drained(name: str, reason: str) -> SlurmNode:
    return SlurmNode(name=name, state=("IDLE", "DRAIN"), reason=reason)


def cluster(n: int, **special: SlurmNode) -> dict[str, SlurmNode]:
    nodes = {f"n{i:02d}": idle(f"n{i:02d}") for i in range(1, n + 1)}
    return {**nodes, **special}


def test_cordons_fold_into_one_reason_per_node() -> None:
    cordons = apply_cordon({}, "n01", Cordon(scope="gpu", gpu_index=3, reason="XID 48 (double-bit ECC)"), lifted=False)
    cordons = apply_cordon(cordons, "n01", Cordon(scope="node", reason="heartbeats lost for 3.1 s"), lifted=False)
    cordons = apply_cordon(cordons, "n02", Cordon(scope="rail", rail=2, reason='link "down"'), lifted=False)
    assert wanted_drains(cordons, BridgeConfig()) == {
        "n01": "ibpool: node: heartbeats lost for 3.1 s",  # the node cordon comes first
        "n02": "ibpool: rail 2: link 'down'",  # no double quotes in a scontrol argument
    }
    # lifting matches scope, GPU and rail whatever the reason; a node left with none is dropped
    cordons = apply_cordon(cordons, "n01", Cordon(scope="node"), lifted=True)
    cordons = apply_cordon(cordons, "n02", Cordon(scope="rail", rail=2), lifted=True)
    assert wanted_drains(cordons, BridgeConfig()) == {"n01": "ibpool: gpu 3: XID 48 (double-bit ECC)"}
    assert set(cordons) == {"n01"}
    # scopes the config does not drain for are kept but drain nothing
    assert wanted_drains(cordons, BridgeConfig(drain_scopes=frozenset({"node"}))) == {}


def test_drains_what_ibpool_wants_and_resumes_only_its_own_drains() -> None:
    slurm = cluster(
        20,
        n03=drained("n03", "ibpool: node: heartbeats lost"),  # ours, no longer wanted: resume
        n04=drained("n04", "bad DIMM, ticket 4711"),  # an operator's: never touched
        n05=drained("n05", "ibpool: node: XID 79"),  # ours and still wanted: nothing to do
    )
    wanted = {"n01": "ibpool: node: connection closed", "n04": "ibpool: gpu 0: XID 48", "n05": "ibpool: node: XID 79"}
    reply = sync(SyncRequest(wanted=wanted, slurm=slurm))
    assert reply.actions == [Drain(node="n01", reason="ibpool: node: connection closed"), Resume(node="n03")]
    assert reply.refused == []
    # what Slurm shows after the actions: the same request again changes nothing (idempotent)
    after = {**slurm, "n01": drained("n01", "ibpool: node: connection closed"), "n03": idle("n03")}
    assert sync(SyncRequest(wanted=wanted, slurm=after)).actions == []


def test_a_down_node_is_drained_and_an_unknown_one_refused() -> None:
    slurm = cluster(10, n02=SlurmNode(name="n02", state=("DOWN",), reason="Not responding"))
    reply = sync(
        SyncRequest(wanted={"n02": "ibpool: node: x", "gpu17": "ibpool: node: y", "dgx01": "ibpool: node: z"},
                    slurm=slurm, names={"dgx01": "n01"})
    )  # fmt: skip
    assert reply.actions == [Drain(node="n01", reason="ibpool: node: z"), Drain(node="n02", reason="ibpool: node: x")]
    assert reply.refused == [Refused(node="gpu17", why="Slurm has no node 'gpu17'")]


def test_mass_drains_past_the_split_brain_limit_are_refused() -> None:
    slurm = cluster(40, n01=drained("n01", "ibpool: node: earlier"))
    wanted = {f"n{i:02d}": "ibpool: node: connection closed" for i in range(1, 11)}
    reply = sync(SyncRequest(wanted=wanted, slurm=slurm, config=BridgeConfig(max_drain_fraction=0.1)))
    assert reply.limit == 4  # floor(0.1 * 40)
    assert [a.node for a in reply.actions] == ["n02", "n03", "n04"]  # n01 is held already: 4 in all
    assert [r.node for r in reply.refused] == [f"n{i:02d}" for i in range(5, 11)]
    assert reply.refused[0].why == "mass drain refused: ibpool may hold 4 of 40 Slurm nodes drained, and 4 are"
    # a small cluster may always lose min_drains_allowed nodes
    small = sync(SyncRequest(wanted={"n01": "a", "n02": "b"}, slurm=cluster(3)))
    assert [a.node for a in small.actions] == ["n01", "n02"] and small.limit == 2


def test_the_same_request_gives_the_same_bytes() -> None:
    slurm = cluster(30, n07=drained("n07", "ibpool: leaf: uplink down"))
    wanted = {f"n{i:02d}": f"ibpool: node: {i}" for i in (9, 1, 5, 3)}
    one = msgspec.json.encode(sync(SyncRequest(wanted=wanted, slurm=slurm)))
    two = msgspec.json.encode(
        sync(SyncRequest(wanted=dict(reversed(wanted.items())), slurm=dict(reversed(slurm.items()))))
    )
    assert one == two


def test_scontrol_show_node_oneliner_is_read_with_its_reason() -> None:
    text = (
        "NodeName=n1 Arch=x86_64 CoresPerSocket=1 CPUAlloc=0 State=IDLE+DRAIN ThreadsPerCore=1 "
        "Reason=ibpool: node: heartbeats lost for 3.1 s [root@2026-12-05T12:00:00]\n"
        "NodeName=n2 Arch=x86_64 State=DOWN* ThreadsPerCore=1 Reason=Not responding [slurm@2026-12-05T12:00:01]\n"
        "NodeName=n3 Arch=x86_64 State=MIXED ThreadsPerCore=1\n"
    )
    nodes = parse_scontrol_nodes(text)
    assert nodes["n1"] == SlurmNode(
        name="n1", state=("IDLE", "DRAIN"), reason="ibpool: node: heartbeats lost for 3.1 s"
    )
    assert nodes["n1"].drained and nodes["n1"].ours
    assert nodes["n2"].state == ("DOWN",) and not nodes["n2"].drained and nodes["n2"].reason == "Not responding"
    assert nodes["n3"].reason == "" and not nodes["n3"].ours
    with pytest.raises(ValueError, match="line 1: no NodeName= or State="):
        parse_scontrol_nodes("Slurm is not answering\n")


def test_actions_are_the_scontrol_arguments() -> None:
    assert Drain(node="n1", reason="ibpool: node: x").scontrol() == [
        "update",
        "NodeName=n1",
        "State=DRAIN",
        "Reason=ibpool: node: x",
    ]
    assert Resume(node="n1").scontrol() == ["update", "NodeName=n1", "State=RESUME"]


NOW = dt.datetime(2026, 12, 5, 12, 0, tzinfo=dt.UTC)


def test_every_node_is_published_once_then_only_what_changed() -> None:
    shown = {"gpu-a01": idle("gpu-a01"), "n02": idle("n02"), "x.lan": idle("x.lan")}
    first = node_changes({}, shown, {"dgx001": "gpu-a01"}, source="slurm_bridge", now=NOW)
    # by fabric host; a host that cannot be a subject key (a dot) is left out
    assert [(e.node_id, e.slurm_node, e.state) for e in first] == [
        ("dgx001", "gpu-a01", ["IDLE"]),
        ("n02", "n02", ["IDLE"]),
    ]
    assert node_changes(shown, shown, {}, source="slurm_bridge", now=NOW) == []
    later = {
        **shown,
        "n02": SlurmNode(name="n02", state=("MIXED", "DRAIN"), reason="ibpool: node: x", gpus=8, gpus_allocated=3),
    }
    [changed] = node_changes(shown, later, {}, source="slurm_bridge", now=NOW)
    assert (changed.key, changed.state, changed.drained_by_ibpool, changed.gpus, changed.gpus_allocated) == (
        "n02",
        ["MIXED", "DRAIN"],
        True,
        8,
        3,
    )
    # the same input, the same events, ids included
    again = node_changes({}, shown, {"dgx001": "gpu-a01"}, source="slurm_bridge", now=NOW)
    assert msgspec.json.encode(again) == msgspec.json.encode(first)


def test_gpus_come_from_the_nodes_tres() -> None:
    line = (
        "NodeName=g1 State=MIXED CfgTRES=cpu=64,mem=1T,billing=64,gres/gpu=8 "
        "AllocTRES=cpu=4,mem=10G,gres/gpu=2 CapWatts=n/a"
    )
    typed = "NodeName=g2 State=IDLE CfgTRES=cpu=8,gres/gpu:h100=4,gres/gpu:a100=2 AllocTRES="
    # what Slurm 22.05 shows without accounting of gres/gpu: the node's Gres= and GresUsed=
    details = (
        "NodeName=g3 Arch=x86_64 Gres=gpu:h100:8(S:0-1),nic:2 GresDrain=N/A GresUsed=gpu:h100:3(IDX:0,2-3),nic:0 "
        "State=MIXED CfgTRES=cpu=2,mem=100M,billing=2 AllocTRES=cpu=1"
    )
    nodes = parse_scontrol_nodes(line + "\n" + typed + "\n" + details + "\n")
    assert (nodes["g1"].gpus, nodes["g1"].gpus_allocated) == (8, 2)
    assert (nodes["g2"].gpus, nodes["g2"].gpus_allocated) == (6, 0)
    assert (nodes["g3"].gpus, nodes["g3"].gpus_allocated) == (8, 3)
