"""The host's InfiniBand adapters as the kernel shows them: `<root>/sys/class/infiniband/<dev>/ports/<n>/`.

Read by the node agent (to forward to the fabric monitor) and by the fabric monitor's own sysfs
source (when it runs on the host). The root is configurable so tests use a fake tree.
"""

from __future__ import annotations

from pathlib import Path

from ibpool_core.fabric.counters import CounterParseError, parse_node_guid, parse_rate, parse_state
from ibpool_proto.node import HcaPort


def read_hca_ports(root: str | Path) -> tuple[list[HcaPort], list[tuple[str, str]]]:
    """Every readable port, and (path, reason) for each device or port that could not be read."""
    base = Path(root) / "sys" / "class" / "infiniband"
    ports: list[HcaPort] = []
    problems: list[tuple[str, str]] = []
    for dev in sorted(base.glob("*")):
        try:
            guid = parse_node_guid((dev / "node_guid").read_text())
        except (OSError, ValueError) as e:
            problems.append((str(dev), f"cannot read node_guid: {e}"))
            continue
        for port_dir in sorted((dev / "ports").glob("*")):
            try:
                _, state = parse_state((port_dir / "state").read_text())
                width, lane = parse_rate((port_dir / "rate").read_text())
                counters = {}
                for f in sorted((port_dir / "counters").glob("*")):
                    text = f.read_text().strip()
                    if text.isdigit():
                        counters[f.name] = int(text)
                number = int(port_dir.name)
            except (OSError, ValueError, CounterParseError) as e:
                problems.append((str(port_dir), str(e)))
                continue
            ports.append(
                HcaPort(
                    device=dev.name,
                    port=number,
                    node_guid=guid,
                    state=state,
                    width=width,
                    lane_gbps=lane,
                    counters=counters,
                )
            )
    return ports, problems
