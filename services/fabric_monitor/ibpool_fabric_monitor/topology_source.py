"""Where the topology comes from: a file in one of the formats ibpool imports, or a generator."""

from __future__ import annotations

from pathlib import Path

import msgspec

from ibpool_core.fabric.model import Topology

from .config import FabricMonitorConfig


class TopologySourceError(Exception):
    """The configured topology cannot be loaded; the message says which file or spec and why."""


def load_native(path: Path) -> Topology:
    try:
        return msgspec.json.decode(path.read_bytes(), type=Topology)
    except (OSError, msgspec.DecodeError) as e:
        raise TopologySourceError(f"{path}: {e}") from None


def topology_loader(cfg: FabricMonitorConfig):  # type: ignore[no-untyped-def]
    def load() -> Topology:
        if cfg.topology_file:
            return load_native(Path(cfg.topology_file))
        raise TopologySourceError(f"no topology: set topology_file (generate={cfg.generate!r} is not wired yet)")

    return load
