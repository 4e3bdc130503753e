import pytest

from ibpool_core.fabric.counters import (
    CounterParseError,
    parse_node_guid,
    parse_perfquery,
    parse_rate,
    parse_state,
)

PERFQUERY = """# Port counters: Lid 12 port 1 (CapMask: 0x5A00)
PortSelect:......................1
CounterSelect:...................0x0000
SymbolErrorCounter:..............17
LinkErrorRecoveryCounter:........2
LinkDownedCounter:...............1
PortRcvErrors:...................0
LocalLinkIntegrityErrors:........0
PortXmitData:....................4294967295
PortXmitWait:....................1234
"""


def test_perfquery_counters_get_sysfs_names() -> None:
    c = parse_perfquery(PERFQUERY)
    assert c["symbol_error"] == 17 and c["link_error_recovery"] == 2 and c["link_downed"] == 1
    assert c["port_xmit_data"] == 4294967295 and c["port_xmit_wait"] == 1234
    assert "PortSelect" not in c


def test_sysfs_strings() -> None:
    assert parse_state("4: ACTIVE\n") == (4, "ACTIVE")
    assert parse_state("1: DOWN") == (1, "DOWN")
    assert parse_rate("400 Gb/sec (4X NDR)\n") == (4, 100.0)
    assert parse_rate("100 Gb/sec (1X NDR)") == (1, 100.0)
    assert parse_rate("56 Gb/sec (4X FDR)") == (4, 14.0625)
    assert parse_node_guid("0002:c903:000e:0b72\n") == "0x0002c903000e0b72"


@pytest.mark.parametrize("bad", ["ACTIVE", "4 ACTIVE", ""])
def test_bad_state_is_quoted(bad: str) -> None:
    with pytest.raises(CounterParseError, match="port state"):
        parse_state(bad)


def test_bad_perfquery_is_quoted() -> None:
    with pytest.raises(CounterParseError, match="garbage"):
        parse_perfquery("SymbolErrorCounter:....1\ngarbage here\n")
    with pytest.raises(CounterParseError, match="no counters"):
        parse_perfquery("# nothing\n")
