"""A seeded model of a node's GPUs: inventory and telemetry that are the same on every run.

Utilisation follows the work placed on each GPU; temperature and power follow utilisation with
lag and noise; ECC errors, retired pages and XID events appear rarely at random. The same seed
and the same sequence of calls give the same numbers, so simulated runs are reproducible.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from ibpool_proto.node import GpuInfo, GpuSample

# name -> (memory MiB, TDP W, idle W, MIG capable)
GPU_MODELS: dict[str, tuple[int, float, float, bool]] = {
    "NVIDIA H100 80GB HBM3": (81559, 700.0, 70.0, True),
    "NVIDIA A100-SXM4-80GB": (81920, 400.0, 55.0, True),
    "NVIDIA A100-SXM4-40GB": (40960, 400.0, 50.0, True),
    "NVIDIA L40S": (46068, 350.0, 35.0, False),
}
DEFAULT_GPU_MODEL = "NVIDIA H100 80GB HBM3"

# XIDs a healthy fleet still shows now and then (NVIDIA's XID catalogue): app errors
# (13, 31, 43) far more often than hardware ones (48 DBE, 63/64 row remap, 74 NVLink, 79 off bus, 94/95 ECC).
XID_WEIGHTS: tuple[tuple[int, int], ...] = (
    (13, 30),
    (31, 30),
    (43, 20),
    (48, 3),
    (63, 5),
    (64, 2),
    (74, 4),
    (79, 1),
    (94, 3),
    (95, 2),
)


@dataclass
class _GpuState:
    utilization: float = 0.0
    temperature: float = 32.0
    memory_used: int = 0
    ecc_volatile: int = 0
    ecc_aggregate: int = 0
    retired_pages: int = 0


@dataclass
class SimulatedGpus:
    """The GPUs of one simulated node. `sample()` advances the model by `dt_s` seconds."""

    node_id: str
    seed: int
    count: int = 8
    model: str = DEFAULT_GPU_MODEL
    # Per-sample probabilities of rare faults; zero turns them off.
    ecc_rate: float = 2e-4
    xid_rate: float = 2e-5
    _rng: random.Random = field(init=False, repr=False)
    _gpus: list[_GpuState] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.model not in GPU_MODELS:
            raise ValueError(f"unknown GPU model {self.model!r}; known: {sorted(GPU_MODELS)}")
        if self.count < 1:
            raise ValueError("a node has at least one GPU")
        self._rng = random.Random(f"{self.seed}:{self.node_id}")
        self._gpus = [_GpuState(temperature=30.0 + self._rng.uniform(0, 4)) for _ in range(self.count)]

    @property
    def memory_mib(self) -> int:
        return GPU_MODELS[self.model][0]

    def gpu_uuid(self, index: int) -> str:
        rng = random.Random(f"uuid:{self.seed}:{self.node_id}:{index}")
        h = f"{rng.getrandbits(128):032x}"
        return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"

    def inventory(self) -> list[GpuInfo]:
        mem, _, _, mig = GPU_MODELS[self.model]
        return [
            GpuInfo(
                index=i,
                uuid=self.gpu_uuid(i),
                model=self.model,
                memory_mib=mem,
                nvlink_domain=f"{self.node_id}/nvl0",
                mig_capable=mig,
            )
            for i in range(self.count)
        ]

    def sample(self, dt_s: float, load: dict[int, int]) -> list[GpuSample]:
        """Advance `dt_s` seconds with `load` = GPU index -> memory MiB the work there uses."""
        mem_total, tdp, idle_w, _ = GPU_MODELS[self.model]
        rng = self._rng
        alpha = min(1.0, dt_s / 20.0)  # thermal time constant of about 20 s
        out = []
        for i, g in enumerate(self._gpus):
            busy = i in load
            target_util = rng.uniform(80.0, 99.0) if busy else 0.0
            g.utilization = max(0.0, min(100.0, g.utilization + (target_util - g.utilization) * 0.6))
            g.memory_used = min(mem_total, load.get(i, 0) + (500 if busy else 0))
            target_temp = 32.0 + 0.45 * g.utilization + rng.gauss(0, 0.5)
            g.temperature += (target_temp - g.temperature) * alpha
            power = idle_w + (tdp - idle_w) * g.utilization / 100.0 + rng.gauss(0, 3.0)
            xids: list[int] = []
            if rng.random() < self.ecc_rate:
                g.ecc_volatile += 1
                g.ecc_aggregate += 1
                if rng.random() < 0.1:
                    g.retired_pages += 1
            if rng.random() < self.xid_rate:
                codes, weights = zip(*XID_WEIGHTS, strict=True)
                xids.append(rng.choices(codes, weights=weights)[0])
            throttle = ["sw_thermal_slowdown"] if g.temperature > 85.0 else []
            out.append(
                GpuSample(
                    index=i,
                    uuid=self.gpu_uuid(i),
                    utilization_pct=round(g.utilization, 1),
                    memory_used_mib=g.memory_used,
                    temperature_c=round(g.temperature, 1),
                    power_w=round(max(idle_w * 0.8, power), 1),
                    ecc_volatile=g.ecc_volatile,
                    ecc_aggregate=g.ecc_aggregate,
                    retired_pages=g.retired_pages,
                    xids=xids,
                    throttle_reasons=throttle,
                )
            )
        return out
