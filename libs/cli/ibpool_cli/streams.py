"""`ibpool streams ensure [--replicas N]`: create or update every stream, as the NATS admin.

Where services connect as users that may only read their streams (deploy/README.md), this is
how the streams come to exist: run once at deploy time, and again after an upgrade that
declares a new stream. The address (with the admin's credentials) comes from IBPOOL_NATS_URL or
--nats-url (and the servers' CA from IBPOOL_NATS_TLS_CA or --tls-ca); the replica count from
IBPOOL_STREAM_REPLICAS or --replicas.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

from ibpool_runtime.bus import Bus, BusUnavailable, StreamSetupError
from ibpool_runtime.streams import STREAMS


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="ibpool streams", description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("action", choices=["ensure"])
    p.add_argument("--nats-url", default=os.environ.get("IBPOOL_NATS_URL", "nats://127.0.0.1:4222"))
    p.add_argument("--replicas", type=int, default=int(os.environ.get("IBPOOL_STREAM_REPLICAS", "1")))
    p.add_argument("--attempts", type=int, default=30, help="connect attempts (the cluster may still be starting)")
    p.add_argument("--tls-ca", default=os.environ.get("IBPOOL_NATS_TLS_CA", ""), help="CA (PEM) of the NATS servers")
    args = p.parse_args(argv)
    try:
        return asyncio.run(_ensure(args.nats_url, args.replicas, args.attempts, args.tls_ca))
    except (BusUnavailable, StreamSetupError) as e:
        print(f"ibpool streams: {e}", file=sys.stderr)
        return 1


async def _ensure(url: str, replicas: int, attempts: int, tls_ca: str) -> int:
    await ensure_streams(url, replicas, attempts, tls_ca, show=True)
    return 0


async def ensure_streams(
    url: str, replicas: int = 1, attempts: int = 10, tls_ca: str = "", *, show: bool = False
) -> None:
    """Create or update every stream through `url` (the admin's credentials); `show` prints them."""
    bus = await Bus.connect(url, name="ibpool-streams", attempts=attempts, tls_ca=tls_ca)
    try:
        await bus.ensure_streams(replicas)
        for spec in STREAMS if show else ():
            info = await bus.js.stream_info(spec.name)
            print(f"{spec.name:<14} replicas {info.config.num_replicas}  subjects {', '.join(spec.subjects)}")
    finally:
        await bus.close()
