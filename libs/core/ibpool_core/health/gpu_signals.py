"""GPU telemetry -> a verdict per GPU: XID codes, uncorrectable ECC, retired pages, heat and thermal throttling.

Pure. `judge_gpu` looks at one sample of one GPU and says the worst thing it shows:

- `node_reboot`: an XID that needs the machine rebooted (79, fallen off the bus): the node fails.
- `failed`: an XID that needs a GPU reset, retired pages or aggregate uncorrectable ECC errors at
  their limits (NVIDIA's RMA guidance counts retired pages), or a temperature at `temp_fail_c`.
- `cordon`: uncorrectable volatile ECC errors since the last reset (new work waits for a reset;
  work running there keeps going, as with a pending row remap), or hot / thermally throttled.
- `application`: an XID that is the application's own fault; the GPU stays in service.
- `ok`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

import msgspec

from ibpool_proto.node import GpuSample

from .xid import XidAction, describe_xid, worst_xid

GpuVerdict = Literal["ok", "application", "cordon", "failed", "node_reboot"]

# Throttle reasons (NVML clocks-event reasons, as the node agent names them) that mean "too hot".
THERMAL_THROTTLE_REASONS = frozenset({"sw_thermal_slowdown", "hw_thermal_slowdown", "hw_slowdown"})


class GpuRules(msgspec.Struct, frozen=True, kw_only=True):
    # Uncorrectable errors since the last reset at which the GPU takes no new work.
    ecc_volatile_cordon: int = 1
    # Lifetime uncorrectable errors at which the GPU is failed.
    ecc_aggregate_fail: int = 100
    # Retired pages at which the GPU is failed (NVIDIA's page-retirement RMA threshold is 60 pages).
    retired_pages_fail: int = 60
    # At or above: the GPU is cordoned; at or above temp_fail_c it is failed.
    temp_cordon_c: float = 90.0
    temp_fail_c: float = 100.0
    # A hot or throttled GPU is uncordoned once cool (below temp_cordon_c - temp_hysteresis_c, no
    # thermal throttling) for the node stable window.
    temp_hysteresis_c: float = 5.0


class GpuJudgement(msgspec.Struct, frozen=True, kw_only=True):
    verdict: GpuVerdict
    reason: str = ""
    xid: int | None = None
    # Hot or throttled in this sample (cordon reasons that clear on their own).
    thermal: bool = False
    # Cool enough to lift a thermal cordon.
    cool: bool = True


def judge_gpu(sample: GpuSample, rules: GpuRules, xid_overrides: Mapping[int, XidAction] | None = None) -> GpuJudgement:
    """The worst verdict one sample of one GPU supports (see the module docstring for the order)."""
    worst = worst_xid(sample.xids, xid_overrides)
    throttled = bool(THERMAL_THROTTLE_REASONS.intersection(sample.throttle_reasons))
    hot = sample.temperature_c >= rules.temp_cordon_c
    cool = not throttled and sample.temperature_c < rules.temp_cordon_c - rules.temp_hysteresis_c
    thermal = hot or throttled
    if worst is not None and worst[1] == "node_reboot":
        return GpuJudgement(
            verdict="node_reboot", reason=describe_xid(worst[0]), xid=worst[0], thermal=thermal, cool=cool
        )
    if worst is not None and worst[1] == "gpu_reset":
        return GpuJudgement(verdict="failed", reason=describe_xid(worst[0]), xid=worst[0], thermal=thermal, cool=cool)
    if sample.retired_pages >= rules.retired_pages_fail:
        reason = f"{sample.retired_pages} retired pages (limit {rules.retired_pages_fail})"
        return GpuJudgement(verdict="failed", reason=reason, thermal=thermal, cool=cool)
    if sample.ecc_aggregate >= rules.ecc_aggregate_fail:
        reason = f"{sample.ecc_aggregate} uncorrectable ECC errors in its life (limit {rules.ecc_aggregate_fail})"
        return GpuJudgement(verdict="failed", reason=reason, thermal=thermal, cool=cool)
    if sample.temperature_c >= rules.temp_fail_c:
        reason = f"temperature {sample.temperature_c:.0f} C (limit {rules.temp_fail_c:.0f} C)"
        return GpuJudgement(verdict="failed", reason=reason, thermal=True, cool=False)
    if sample.ecc_volatile >= rules.ecc_volatile_cordon:
        reason = f"{sample.ecc_volatile} uncorrectable ECC errors since reset (limit {rules.ecc_volatile_cordon})"
        return GpuJudgement(verdict="cordon", reason=reason, thermal=thermal, cool=cool)
    if thermal:
        why = ", ".join(sorted(THERMAL_THROTTLE_REASONS.intersection(sample.throttle_reasons)))
        reason = f"thermal: {sample.temperature_c:.0f} C" + (f", throttled ({why})" if why else "")
        return GpuJudgement(verdict="cordon", reason=reason, thermal=True, cool=cool)
    if worst is not None and worst[1] == "application":
        return GpuJudgement(verdict="application", reason=describe_xid(worst[0]), xid=worst[0], cool=cool)
    return GpuJudgement(verdict="ok", cool=cool)
