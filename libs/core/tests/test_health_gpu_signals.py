"""One GPU sample -> its worst verdict: XID, ECC, retired pages, heat, thermal throttling."""

import pytest

from ibpool_core.health.gpu_signals import GpuRules, judge_gpu
from ibpool_proto.node import GpuSample

RULES = GpuRules(
    ecc_volatile_cordon=1, ecc_aggregate_fail=100, retired_pages_fail=60, temp_cordon_c=90, temp_fail_c=100
)


def gpu(**kw: object) -> GpuSample:
    base: dict[str, object] = {
        "index": 0,
        "uuid": "GPU-0",
        "utilization_pct": 50.0,
        "memory_used_mib": 1000,
        "temperature_c": 60.0,
    }
    return GpuSample(**{**base, "power_w": 300.0, **kw})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("name", "sample", "verdict", "reason_has"),
    [
        ("healthy", gpu(), "ok", ""),
        ("application XID", gpu(xids=[13]), "application", "XID 13"),
        ("contained ECC is the application's", gpu(xids=[94]), "application", "XID 94"),
        ("double-bit ECC needs a reset", gpu(xids=[48]), "failed", "XID 48"),
        ("row remap needs a reset", gpu(xids=[63]), "failed", "XID 63"),
        ("NVLink error needs a reset", gpu(xids=[74]), "failed", "XID 74"),
        ("uncontained ECC needs a reset", gpu(xids=[95]), "failed", "XID 95"),
        ("fallen off the bus needs a reboot", gpu(xids=[13, 79]), "node_reboot", "XID 79"),
        ("unknown XID alone acts on nothing", gpu(xids=[9999]), "ok", ""),
        ("retired pages at the limit", gpu(retired_pages=60), "failed", "60 retired pages"),
        ("retired pages below the limit", gpu(retired_pages=59), "ok", ""),
        ("lifetime ECC at the limit", gpu(ecc_aggregate=100), "failed", "uncorrectable ECC errors in its life"),
        ("volatile ECC cordons", gpu(ecc_volatile=1, ecc_aggregate=1), "cordon", "since reset"),
        ("hot cordons", gpu(temperature_c=91.0), "cordon", "thermal: 91 C"),
        ("throttled cordons", gpu(temperature_c=80.0, throttle_reasons=["sw_thermal_slowdown"]), "cordon", "throttled"),
        ("power cap is not thermal", gpu(throttle_reasons=["sw_power_cap"]), "ok", ""),
        ("too hot fails", gpu(temperature_c=101.0), "failed", "temperature 101 C"),
        ("a reset beats a cordon", gpu(xids=[48], ecc_volatile=3), "failed", "XID 48"),
    ],
)
def test_judge_gpu(name: str, sample: GpuSample, verdict: str, reason_has: str) -> None:
    j = judge_gpu(sample, RULES)
    assert j.verdict == verdict, name
    assert reason_has in j.reason, (name, j.reason)


@pytest.mark.parametrize(
    ("temperature", "throttle", "cool"),
    [(60.0, [], True), (85.0, [], False), (84.9, [], True), (70.0, ["hw_thermal_slowdown"], False)],
)
def test_cool_has_hysteresis_below_the_cordon_threshold(temperature: float, throttle: list[str], cool: bool) -> None:
    assert judge_gpu(gpu(temperature_c=temperature, throttle_reasons=throttle), RULES).cool is cool


def test_xid_override_reclassifies() -> None:
    assert judge_gpu(gpu(xids=[13]), RULES, {13: "gpu_reset"}).verdict == "failed"
