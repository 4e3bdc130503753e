"""Reading port state and counters from the text the kernel and infiniband-diags give. Pure parsing.

sysfs (`/sys/class/infiniband/<dev>/ports/<n>/`): `state` ("4: ACTIVE"), `phys_state` ("5: LinkUp"),
`rate` ("400 Gb/sec (4X NDR)"), `counters/<name>` (one integer each). `perfquery` prints
"SymbolErrorCounter:......0" lines; both map to the snake_case names sysfs uses.
"""

from __future__ import annotations

import re

from .model import LANE_GBPS, normalize_guid


class CounterParseError(ValueError):
    """Text that is not what the kernel or perfquery prints; the message quotes it."""


# perfquery field -> sysfs counter name
PERFQUERY_FIELDS = {
    "SymbolErrorCounter": "symbol_error",
    "LinkErrorRecoveryCounter": "link_error_recovery",
    "LinkDownedCounter": "link_downed",
    "PortRcvErrors": "port_rcv_errors",
    "PortRcvRemotePhysicalErrors": "port_rcv_remote_physical_errors",
    "PortRcvSwitchRelayErrors": "port_rcv_switch_relay_errors",
    "PortXmitDiscards": "port_xmit_discards",
    "PortXmitConstraintErrors": "port_xmit_constraint_errors",
    "PortRcvConstraintErrors": "port_rcv_constraint_errors",
    "LocalLinkIntegrityErrors": "local_link_integrity_errors",
    "ExcessiveBufferOverrunErrors": "excessive_buffer_overrun_errors",
    "VL15Dropped": "VL15_dropped",
    "PortXmitData": "port_xmit_data",
    "PortRcvData": "port_rcv_data",
    "PortXmitPkts": "port_xmit_packets",
    "PortRcvPkts": "port_rcv_packets",
    "PortXmitWait": "port_xmit_wait",
}

_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*Gb/sec\s*\((\d+)X\s*([A-Z0-9]+)\)\s*$")
_STATE = re.compile(r"^\s*(\d+):\s*(\w+)\s*$")
_PERF_LINE = re.compile(r"^(\w+):\.*\s*(0x[0-9a-fA-F]+|\d+)\s*$")


def parse_state(text: str) -> tuple[int, str]:
    """`4: ACTIVE` -> (4, "ACTIVE")."""
    m = _STATE.match(text)
    if not m:
        raise CounterParseError(f"port state {text.strip()!r} is not '<n>: <NAME>'")
    return int(m.group(1)), m.group(2).upper()


def parse_rate(text: str) -> tuple[int, float]:
    """`400 Gb/sec (4X NDR)` -> (width 4, 100.0 Gb/s per lane)."""
    m = _RATE.match(text)
    if not m:
        raise CounterParseError(f"port rate {text.strip()!r} is not '<n> Gb/sec (<w>X <SPEED>)'")
    width, speed = int(m.group(2)), m.group(3)
    if speed in LANE_GBPS:
        return width, LANE_GBPS[speed]
    return width, float(m.group(1)) / width


def parse_node_guid(text: str) -> str:
    """sysfs writes `0002:c903:000e:0b72`."""
    return normalize_guid(text.strip().replace(":", ""))


def parse_perfquery(text: str) -> dict[str, int]:
    """perfquery's port counters as {sysfs counter name: value}; unknown fields keep their own name."""
    counters: dict[str, int] = {}
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        m = _PERF_LINE.match(line.strip())
        if not m:
            raise CounterParseError(f"perfquery line {line.strip()!r} is not 'Name:....value'")
        name, value = m.group(1), m.group(2)
        if name in ("PortSelect", "CounterSelect", "CounterSelect2"):
            continue
        counters[PERFQUERY_FIELDS.get(name, name)] = int(value, 0)
    if not counters:
        raise CounterParseError("perfquery output has no counters")
    return counters
