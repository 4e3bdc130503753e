"""`ibpool services`: every running service instance, found from the bus alone.

Each instance answers the NATS service API (`ibpool_runtime.discovery`). This lists what
answers within `--wait` seconds: the service, its instance, its role (leader, standby or
active), its version and the URL of its HTTP API.

The NATS address comes from `--nats-url` or IBPOOL_NATS_URL. A URL naming a user makes its
replies come on that user's inbox. Without either, it comes from the stack in `--state-dir`
(`ibpool dev up` or `ibpool run`), as its operator user.

Example:

    ibpool services --state-dir .ibpool/dev
    ibpool services --nats-url nats://operator:SECRET@nats-1:4222 --output json

Exit codes: 0 when at least one instance answered; 1 when none did, or NATS cannot be reached;
2 for a usage error.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

import msgspec

from ibpool_runtime import devstack
from ibpool_runtime.bus import Bus, BusUnavailable
from ibpool_runtime.discovery import ServiceView, services

from .ops import OpsError, config_path, connection_options, emit, file_defaults, table

COLUMNS = ("service", "instance", "role", "version", "http_url")


def main(argv: list[str]) -> int:
    doc = __doc__ or ""
    p = argparse.ArgumentParser(
        prog="ibpool services",
        description=doc.split("\n\n")[0],
        epilog=doc.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    try:  # the operator's config file, as for the other verbs (ibpool_cli.ops)
        conf = file_defaults(config_path())
    except OpsError as e:
        print(f"ibpool services: {e}", file=sys.stderr)
        return e.code
    connection_options(p, conf)
    p.add_argument("--output", "-o", choices=["table", "json", "yaml"], default="table")
    p.add_argument("--wait", type=float, default=1.0, help="seconds to wait for answers (default 1)")
    args = p.parse_args(argv)
    url = args.nats_url
    if not url:
        info = devstack.read_info(Path(args.state_dir))
        if info is None:
            print(f"ibpool services: no stack in {args.state_dir} and no --nats-url", file=sys.stderr)
            return 1
        url = devstack.nats_url_as(info, "operator")
    try:
        found = asyncio.run(_ask(url, args.tls_ca, args.wait))
    except BusUnavailable as e:
        print(f"ibpool services: {e}", file=sys.stderr)
        return 1
    emit(msgspec.to_builtins(found), args.output, lambda _: render(found))
    return 0 if found else 1


async def _ask(url: str, tls_ca: str, wait_s: float) -> list[ServiceView]:
    bus = await Bus.connect(url, name="ibpool-services", attempts=2, tls_ca=tls_ca)
    try:
        return await services(bus, wait_s=wait_s)
    finally:
        await bus.close()


def render(found: list[ServiceView]) -> str:
    """A plain table, one instance per line (nothing answered: a line saying so)."""
    if not found:
        return "no service answered"
    return table(COLUMNS, [(v.service, v.instance, v.role, v.version, v.http_url) for v in found])
