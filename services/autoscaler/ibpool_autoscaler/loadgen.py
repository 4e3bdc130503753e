"""A load generator for demos and tests: publishes `DeploymentMetricsReported` for a deployment along a
ramp (base -> peak -> base), as an ingress in front of it would. `ramp_requests_per_s` is pure; `LoadRamp`
publishes it.

    python -m ibpool_autoscaler.loadgen DEPLOYMENT --duration 120 --base 5 --peak 35

(NATS address from `IBPOOL_NATS_URL`.)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time

from ibpool_proto.scale import DeploymentMetricsReported
from ibpool_runtime.bus import Bus


def ramp_requests_per_s(elapsed_s: float, duration_s: float, base: float, peak: float) -> float:
    """The request rate `elapsed_s` into a ramp of `duration_s`: base for the first fifth, rising
    linearly to peak by two fifths, peak until three fifths, then back to base at once (the drop that
    the scale-down window must ride out)."""
    if duration_s <= 0:
        return base
    f = elapsed_s / duration_s
    if f < 0.2 or f >= 0.6:
        return base
    if f < 0.4:
        return base + (peak - base) * (f - 0.2) / 0.2
    return peak


class LoadRamp:
    def __init__(
        self, bus: Bus, deployment: str, duration_s: float, base: float, peak: float, period_s: float = 1.0
    ) -> None:
        self.bus, self.deployment = bus, deployment
        self.duration_s, self.base, self.peak, self.period_s = duration_s, base, peak, period_s
        self.last_requests_per_s = base

    async def run(self, stop: asyncio.Event) -> None:
        """Publish one report every `period_s` until `stop` (or the end of the ramp, then base forever)."""
        started = time.monotonic()
        while not stop.is_set():
            rps = ramp_requests_per_s(time.monotonic() - started, self.duration_s, self.base, self.peak)
            self.last_requests_per_s = rps
            await self.bus.publish(
                DeploymentMetricsReported(
                    source="loadgen", key=self.deployment, deployment=self.deployment, requests_per_s=round(rps, 3)
                )
            )
            try:
                await asyncio.wait_for(stop.wait(), timeout=self.period_s)
            except TimeoutError:
                pass


async def _main(args: argparse.Namespace) -> int:
    bus = await Bus.connect(os.environ.get("IBPOOL_NATS_URL", "nats://127.0.0.1:4222"), name="ibpool-loadgen")
    stop = asyncio.Event()
    ramp = LoadRamp(bus, args.deployment, args.duration, args.base, args.peak, args.period)
    task = asyncio.create_task(ramp.run(stop))
    try:
        await asyncio.sleep(args.duration)
    finally:
        stop.set()
        await task
        await bus.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ibpool_autoscaler.loadgen", description=__doc__.split("\n\n")[0])
    p.add_argument("deployment")
    p.add_argument("--duration", type=float, default=120.0, help="seconds of the ramp")
    p.add_argument("--base", type=float, default=5.0, help="requests/s before and after the peak")
    p.add_argument("--peak", type=float, default=35.0, help="requests/s at the peak")
    p.add_argument("--period", type=float, default=1.0, help="seconds between reports")
    return asyncio.run(_main(p.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
