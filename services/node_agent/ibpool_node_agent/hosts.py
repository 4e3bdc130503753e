"""The host figures (CPU, memory, network, disk) of every node this agent hosts, from one place.

A node on real hardware is this machine, measured with psutil (`HostMeter`, one for the process
however many GPU backends read it); a simulated node's host follows the work granted on its GPUs.
"""

from __future__ import annotations

import time

import psutil

from ibpool_proto.node import HostSample


class HostMetrics:
    """`sample(node, load)` for every hosted node: simulated nodes from their load, the others measured."""

    def __init__(self, simulated: set[str]) -> None:
        self.simulated = simulated
        self._meter: HostMeter | None = None

    def sample(self, node_id: str, load: dict[int, int]) -> HostSample:
        """Raises OSError when this machine's figures cannot be read."""
        if node_id in self.simulated:
            return simulated_host(load)
        if self._meter is None:
            self._meter = HostMeter()
        return self._meter.sample()


def simulated_host(load: dict[int, int]) -> HostSample:
    """A simulated node's host follows its work: each busy GPU keeps about 1.5 cores of 32 busy feeding
    it and pins host memory for about a quarter of its GPU memory (`load`: GPU index -> MiB in use)."""
    busy = len(load)
    return HostSample(
        cpu_pct=min(100.0, 2.0 + busy * 150.0 / 32),
        memory_used_mib=4096 + sum(load.values()) // 4,
        net_rx_bps=busy * 2e8,
        net_tx_bps=busy * 2e8,
        disk_used_pct=35.0,
    )


class HostMeter:
    """This machine's CPU, memory, network throughput (since the last sample) and root disk use (psutil)."""

    def __init__(self, disk_path: str = "/") -> None:
        self.disk_path = disk_path
        psutil.cpu_percent(None)  # the first call only starts the measurement window
        self._net = psutil.net_io_counters()
        self._at = time.monotonic()

    def sample(self) -> HostSample:
        now, net = time.monotonic(), psutil.net_io_counters()
        span = max(now - self._at, 1e-3)
        rx = (net.bytes_recv - self._net.bytes_recv) * 8 / span
        tx = (net.bytes_sent - self._net.bytes_sent) * 8 / span
        self._net, self._at = net, now
        return HostSample(
            cpu_pct=float(psutil.cpu_percent(None)),
            memory_used_mib=int(psutil.virtual_memory().used // (1 << 20)),
            net_rx_bps=max(0.0, rx),
            net_tx_bps=max(0.0, tx),
            disk_used_pct=float(psutil.disk_usage(self.disk_path).percent),
        )
