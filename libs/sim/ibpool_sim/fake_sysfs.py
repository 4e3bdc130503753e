"""A fake `/sys/class/infiniband` tree, as the kernel lays it out, for code that reads HCA ports from a root."""

from __future__ import annotations

from pathlib import Path


def write_hca_port(root: Path, dev: str, guid_text: str, port: int, state: str, rate: str, **counters: int) -> Path:
    """Create or overwrite one port of adapter `dev` under `root`; returns the port's directory.

    `guid_text` as the kernel prints node_guid ("0002:c903:000e:0b72"), `state` as "4: ACTIVE",
    `rate` as "400 Gb/sec (4X NDR)"; each counter becomes `counters/<name>`.
    """
    d = root / "sys/class/infiniband" / dev
    p = d / "ports" / str(port)
    (p / "counters").mkdir(parents=True, exist_ok=True)
    (d / "node_guid").write_text(guid_text + "\n")
    (p / "state").write_text(state + "\n")
    (p / "rate").write_text(rate + "\n")
    for name, value in counters.items():
        (p / "counters" / name).write_text(f"{value}\n")
    return p
