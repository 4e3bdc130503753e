"""Where the topology comes from: a file in one of the formats ibpool imports, or a generator."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import msgspec

from ibpool_core.fabric.generators import generate
from ibpool_core.fabric.model import Topology, rename_hosts

from .config import FabricMonitorConfig


class TopologySourceError(Exception):
    """The configured topology cannot be loaded; the message says which file or spec and why."""


def load_native(path: Path) -> Topology:
    try:
        return msgspec.json.decode(path.read_bytes(), type=Topology)
    except (OSError, msgspec.DecodeError) as e:
        raise TopologySourceError(f"{path}: {e}") from None


def generated(spec: str, host_name_format: str) -> Topology:
    try:
        topology = generate(spec)
    except ValueError as e:
        raise TopologySourceError(f"generate={spec!r}: {e}") from None
    if host_name_format:
        names = {h.name: host_name_format.format(i) for i, h in enumerate(topology.hosts, 1)}
        topology = rename_hosts(topology, names)
    return topology


def topology_loader(cfg: FabricMonitorConfig) -> Callable[[], Topology]:
    def load() -> Topology:
        if cfg.topology_file:
            return load_native(Path(cfg.topology_file))
        return generated(cfg.generate, cfg.host_name_format)

    return load
