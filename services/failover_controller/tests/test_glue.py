"""The controller's glue without a bus or database: config -> core config, XID overrides, node views."""

from __future__ import annotations

import datetime as dt

import pytest

from ibpool_core.health.decide import GpuHealth, NodeHealth
from ibpool_failover_controller.api import node_view
from ibpool_failover_controller.config import FailoverControllerConfig, core_config, parse_xid_overrides
from ibpool_runtime.config import load_config


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("", {}),
        ("13=gpu_reset", {13: "gpu_reset"}),
        (" 13=gpu_reset , 31=none,", {13: "gpu_reset", 31: "none"}),
    ],
)
def test_xid_overrides_parse(text: str, want: dict[int, str]) -> None:
    assert parse_xid_overrides(text) == want


@pytest.mark.parametrize("text", ["13", "x=none", "13=reboot", "13=gpu_reset,=none"])
def test_bad_xid_overrides_name_the_item(text: str) -> None:
    with pytest.raises(ValueError, match="xid_overrides item"):
        parse_xid_overrides(text)


def test_env_reaches_the_core_config() -> None:
    env = {
        "IBPOOL_FAILOVER_CONTROLLER_FAIL_AFTER_S": "7.5",
        "IBPOOL_FAILOVER_CONTROLLER_MAX_FAILED_FRACTION": "0.3",
        "IBPOOL_FAILOVER_CONTROLLER_XID_OVERRIDES": "13=gpu_reset",
        "IBPOOL_FAILOVER_CONTROLLER_TEMP_CORDON_C": "80",
    }
    cfg = load_config(FailoverControllerConfig, "failover_controller", env=env)
    core = core_config(cfg, "failover_controller/a")
    assert core.heartbeat.fail_after_s == 7.5
    assert core.max_failed_fraction == 0.3
    assert core.xid_overrides == {13: "gpu_reset"}
    assert core.gpu.temp_cordon_c == 80.0
    assert core.source == "failover_controller/a"


def test_node_view_lists_problem_gpus_and_cordoned_rails() -> None:
    n = NodeHealth(
        node_id="n1",
        status="failed",
        since=dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
        gpus={3: GpuHealth(index=3, failed=True, cordoned=True, reason="XID 48", xid=48)},
        rail_cordons={2: ["L1"], 0: ["L0"]},
        leaf_cordons=["U1"],
    )
    v = node_view(n)
    assert v.rails_cordoned == [0, 2] and v.leaf_cordoned
    assert [(g.index, g.xid) for g in v.gpus] == [(3, 48)]
