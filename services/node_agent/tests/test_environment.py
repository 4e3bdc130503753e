"""The environment of a granted workload: the workload's own, the rank variables from the
allocation's nodes in rank order, and the grant's enforcement, in that order of precedence."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from ibpool_node_agent.config import NodeAgentConfig
from ibpool_node_agent.environment import RANK_VARIABLES, RankError, rank_env, workload_env
from ibpool_proto.pool import AllocationGranted, Enforcement, GpuAssignment, WorkloadSpec
from ibpool_runtime.config import load_config

T0 = dt.datetime(2026, 12, 1, 14, 0, tzinfo=dt.UTC)


def grant(
    node_id: str, nodes: list[str], *, workload: WorkloadSpec | None = None, env: dict[str, str] | None = None
) -> AllocationGranted:
    return AllocationGranted(
        source="test",
        key=node_id,
        allocation_id="a1",
        job_id="j1",
        node_id=node_id,
        kind="gang" if len(nodes) > 1 else "whole",
        assignments=[GpuAssignment(node_id=node_id, gpu_index=0)],
        enforcement=Enforcement(env=env or {"CUDA_VISIBLE_DEVICES": "0"}),
        lease_expires_at=T0,
        ledger_version=1,
        workload=workload,
        nodes=nodes,
    )


@pytest.mark.parametrize(
    ("node_id", "nodes", "rank", "size", "master"),
    [
        ("h3", ["h3", "h1", "h2"], "0", "3", "h3"),
        ("h1", ["h3", "h1", "h2"], "1", "3", "h3"),
        ("h2", ["h3", "h1", "h2"], "2", "3", "h3"),
        ("solo", [], "0", "1", "solo"),  # a grant without its node list: one node
        ("solo", ["solo"], "0", "1", "solo"),
    ],
)
def test_each_member_gets_its_position_in_the_rank_order_not_in_name_order(
    node_id: str, nodes: list[str], rank: str, size: str, master: str
) -> None:
    env = rank_env(node_id, nodes)
    assert env == {
        "IBPOOL_RANK": rank,
        "IBPOOL_WORLD_SIZE": size,
        "IBPOOL_HOSTS": ",".join(nodes or [node_id]),
        "NODE_RANK": rank,
        "NNODES": size,
        "MASTER_ADDR": master,
    }
    assert set(env) == set(RANK_VARIABLES)


@pytest.mark.parametrize(
    ("node_id", "nodes", "message"),
    [
        ("h9", ["h1", "h2"], "node h9 is not among the allocation's nodes (h1, h2)"),
        ("h1", ["h1", "h2", "h1"], "the allocation's nodes name h1 more than once"),
    ],
)
def test_a_node_list_that_gives_no_single_rank_is_an_error_saying_why(
    node_id: str, nodes: list[str], message: str
) -> None:
    with pytest.raises(RankError, match=f"^{message}$".replace("(", r"\(").replace(")", r"\)")):
        rank_env(node_id, nodes)


def test_the_workload_env_the_rank_and_the_enforcement_make_the_environment() -> None:
    spec = WorkloadSpec(command=["train"], env={"NCCL_COLLNET_ENABLE": "1", "SHARP_COLL_ENABLE_SAT": "1"})
    env = workload_env(grant("h2", ["h1", "h2"], workload=spec), {"CUDA_VISIBLE_DEVICES": "0,1"})
    assert env == {
        "MASTER_PORT": "29500",
        "NCCL_COLLNET_ENABLE": "1",
        "SHARP_COLL_ENABLE_SAT": "1",
        "IBPOOL_RANK": "1",
        "IBPOOL_WORLD_SIZE": "2",
        "IBPOOL_HOSTS": "h1,h2",
        "NODE_RANK": "1",
        "NNODES": "2",
        "MASTER_ADDR": "h1",
        "CUDA_VISIBLE_DEVICES": "0,1",
    }


def test_the_workload_cannot_override_its_rank_or_its_limits_but_may_pick_its_port() -> None:
    spec = WorkloadSpec(
        env={"MASTER_PORT": "12345", "NODE_RANK": "7", "MASTER_ADDR": "elsewhere", "CUDA_VISIBLE_DEVICES": "0-7"}
    )
    env = workload_env(grant("h1", ["h1", "h2"], workload=spec), {"CUDA_VISIBLE_DEVICES": "3"})
    assert (env["MASTER_PORT"], env["NODE_RANK"], env["MASTER_ADDR"]) == ("12345", "0", "h1")
    assert env["CUDA_VISIBLE_DEVICES"] == "3"


def test_a_grant_without_workload_still_gets_rank_variables_and_its_limits() -> None:
    env = workload_env(grant("n1", []), {"CUDA_VISIBLE_DEVICES": "0"})
    assert env["NNODES"] == "1" and env["MASTER_ADDR"] == "n1" and env["CUDA_VISIBLE_DEVICES"] == "0"
    assert "NCCL_COLLNET_ENABLE" not in env


def test_node_labels_come_from_the_toml_table(tmp_path: Path) -> None:
    toml = tmp_path / "agent.toml"
    toml.write_text('[node_agent.labels]\n"ibpool.io/leaf" = "leaf-07"\n"ibpool.io/sharp" = "true"\n')
    cfg = load_config(NodeAgentConfig, "node_agent", env={}, toml_path=toml)
    assert cfg.labels == {"ibpool.io/leaf": "leaf-07", "ibpool.io/sharp": "true"}
