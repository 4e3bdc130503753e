"""XID codes by what they ask of the operator: nothing, restart the application, reset the GPU, reboot the node.

Source: NVIDIA's XID catalogue for Ampere and newer GPUs, column "Resolution Bucket (Immediate
Action)" (https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html), and the A100 memory
error management guide for row remapping and contained/uncontained ECC errors
(https://docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/). RESTART_APP is an application error (the
job's own fault; the GPU stays in service), RESET_GPU takes the GPU out until it is reset, and
RESTART_BM (reboot the machine) fails the node. Codes not in the table are `unknown`: they take
nothing out of service on their own; `FailoverConfig.xid_overrides` reclassifies any code.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

XidAction = Literal["none", "application", "gpu_reset", "node_reboot", "unknown"]

# The order of severity: a sample with several codes is judged by its worst one.
SEVERITY: dict[XidAction, int] = {"none": 0, "unknown": 1, "application": 2, "gpu_reset": 3, "node_reboot": 4}

XID_CATALOGUE: dict[int, tuple[XidAction, str]] = {
    8: ("application", "GPU stopped processing (channel idle timeout)"),
    13: ("application", "graphics engine exception"),
    31: ("application", "GPU memory page fault"),
    43: ("application", "GPU stopped processing (reset channel)"),
    # Logged after an earlier error as the driver cleans up; the earlier code carries the verdict.
    45: ("none", "preemptive cleanup after previous errors"),
    48: ("gpu_reset", "double-bit ECC error"),
    61: ("gpu_reset", "internal micro-controller breakpoint"),
    62: ("gpu_reset", "internal micro-controller halt"),
    # The driver prints "reset gpu to activate": the remap takes effect only after a GPU reset.
    63: ("gpu_reset", "ECC page retirement or row remapping recorded"),
    64: ("gpu_reset", "ECC page retirement or row remapping failure"),
    69: ("application", "graphics engine class error"),
    74: ("gpu_reset", "NVLink error"),
    79: ("node_reboot", "GPU has fallen off the bus"),
    # Watch, do not act: single-bit errors are corrected; the rate is a trend for the operator.
    92: ("none", "high single-bit ECC error rate"),
    94: ("application", "contained ECC error (only the application that touched the memory is affected)"),
    95: ("gpu_reset", "uncontained ECC error"),
    109: ("application", "context switch timeout"),
    119: ("gpu_reset", "GSP RPC timeout"),
    120: ("gpu_reset", "GSP error"),
    121: ("none", "corrected C2C link error"),
    140: ("gpu_reset", "unrecovered ECC error"),
}


def classify_xid(code: int, overrides: Mapping[int, XidAction] | None = None) -> XidAction:
    """What `code` asks for: the override when one is given, the catalogue's bucket, else `unknown`."""
    if overrides and code in overrides:
        return overrides[code]
    entry = XID_CATALOGUE.get(code)
    return "unknown" if entry is None else entry[0]


def describe_xid(code: int) -> str:
    entry = XID_CATALOGUE.get(code)
    return f"XID {code}" if entry is None else f"XID {code} ({entry[1]})"


def worst_xid(codes: list[int], overrides: Mapping[int, XidAction] | None = None) -> tuple[int, XidAction] | None:
    """The most severe code of a sample with its action (the first of equals), None when there is none."""
    best: tuple[int, XidAction] | None = None
    for code in codes:
        action = classify_xid(code, overrides)
        if best is None or SEVERITY[action] > SEVERITY[best[1]]:
            best = (code, action)
    return best
