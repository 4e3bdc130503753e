"""`python -m ibpool_node_agent [--nodes N] [--seed S] [--prefix P]`; everything else from env/TOML."""

from __future__ import annotations

import argparse
import os
import sys

from ibpool_runtime.service import run_service

from .backends import store_schema
from .bootstrap import bootstrap
from .config import NodeAgentConfig

SERVICE = "node_agent"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="ibpool-node-agent", description="ibpool node agent")
    p.add_argument("--nodes", type=int, help="simulated nodes hosted by this process")
    p.add_argument("--seed", type=int, help="seed of the simulated GPU model")
    p.add_argument("--prefix", help="node id prefix (node ids are <prefix>-001, ...)")
    p.add_argument("--first", type=int, help="number of the first node")
    p.add_argument("--http-port", type=int)
    args = p.parse_args(argv)
    for flag, field in (
        ("nodes", "nodes"),
        ("seed", "seed"),
        ("prefix", "node_prefix"),
        ("first", "first_node"),
        ("http_port", "http_port"),
    ):
        value = getattr(args, flag)
        if value is not None:
            os.environ[f"IBPOOL_NODE_AGENT_{field.upper()}"] = str(value)
    return run_service(SERVICE, NodeAgentConfig, bootstrap, schema=store_schema)


if __name__ == "__main__":
    sys.exit(main())
