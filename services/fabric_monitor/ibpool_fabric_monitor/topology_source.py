"""Where the topology comes from: a file in one of the formats ibpool imports, or a generator."""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Callable
from pathlib import Path

from ibpool_core.fabric.formats import guess_format, import_topology, parse_name_map
from ibpool_core.fabric.generators import generate
from ibpool_core.fabric.model import FabricError, Topology, rename_hosts

from .config import FabricMonitorConfig


class TopologySourceError(Exception):
    """The configured topology cannot be loaded; the message says which file or spec and why."""


def load_file(path: Path, fmt: str, names_file: str = "") -> Topology:
    try:
        text = path.read_text()
        names = parse_name_map(Path(names_file).read_text(), file=names_file) if names_file else None
        kind = guess_format(str(path), text) if fmt == "auto" else fmt
        return import_topology(kind, text, file=str(path), names=names, name=path.stem)
    except OSError as e:
        raise TopologySourceError(f"{e.filename or path}: {e.strerror}") from None
    except (FabricError, ValueError) as e:
        raise TopologySourceError(str(e)) from None


def discovered(command: str, names_file: str = "") -> Topology:
    """Run a discovery command (ibnetdiscover) and import what it prints."""
    argv = shlex.split(command)
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise TopologySourceError(f"discover_command {command!r}: {e}") from None
    if r.returncode != 0:
        raise TopologySourceError(f"discover_command {command!r} exited {r.returncode}: {r.stderr.strip()[:500]}")
    try:
        names = parse_name_map(Path(names_file).read_text(), file=names_file) if names_file else None
        return import_topology("ibnetdiscover", r.stdout, file=f"<{argv[0]} output>", names=names, name="fabric")
    except OSError as e:
        raise TopologySourceError(f"{e.filename}: {e.strerror}") from None
    except (FabricError, ValueError) as e:
        raise TopologySourceError(str(e)) from None


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
        if cfg.discover_command:
            return discovered(cfg.discover_command, cfg.names_file)
        if cfg.topology_file:
            return load_file(Path(cfg.topology_file), cfg.topology_format, cfg.names_file)
        return generated(cfg.generate, cfg.host_name_format)

    return load
