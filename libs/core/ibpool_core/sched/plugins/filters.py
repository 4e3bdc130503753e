"""Filter plugins: may this host run one member of the job? Each answers None (yes) or a short,
stable reason (counted across hosts to explain an unschedulable job)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..framework import ClusterView, HostState, PlacementAsk
from .args import numeric_args


class Fits:
    """`fits`: the host has at least `gpus_per_host` free GPUs now (its free GPUs less this cycle's
    reservations, `ClusterView.free`). Contract: reads `view.free` only."""

    host_local = True

    def filter(self, ask: PlacementAsk, view: ClusterView, host: HostState) -> str | None:
        return None if view.free(host.name) >= ask.gpus_per_host else "too few free GPUs"


class Health:
    """`health`: only hosts whose health state is "ready" (not cordoned, draining, suspect, failed
    or unknown: the failover controller's verdicts). Contract: reads `host.health` only."""

    host_local = True

    def filter(self, ask: PlacementAsk, view: ClusterView, host: HostState) -> str | None:
        return None if host.health == "ready" else f"node {host.health}"


class GpuModel:
    """`gpu-model`: the host's GPU model is the one asked for (any model when the ask names none).
    Contract: reads `host.gpu_model` only."""

    host_local = True

    def filter(self, ask: PlacementAsk, view: ClusterView, host: HostState) -> str | None:
        return None if ask.gpu_model is None or host.gpu_model == ask.gpu_model else "other GPU model"


def make_fits(args: Mapping[str, Any]) -> Fits:
    numeric_args(args, {})
    return Fits()


def make_health(args: Mapping[str, Any]) -> Health:
    numeric_args(args, {})
    return Health()


def make_gpu_model(args: Mapping[str, Any]) -> GpuModel:
    numeric_args(args, {})
    return GpuModel()
