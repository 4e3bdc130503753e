"""Reserve and Permit plugins: holding GPUs for the members, and the gang barrier."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..framework import ClusterView, PermitVerdict, PlacementAsk
from .args import numeric_args


class ReserveGpus:
    """`gpus` (Reserve): holds `gpus` GPUs of the host for the job in the view (`ClusterView.hold`),
    so later placements of the same cycle see them taken. Fails, changing nothing, when the host
    has fewer free GPUs now. `unreserve` gives back whatever the job holds on the host (safe when
    nothing is held)."""

    def reserve(self, ask: PlacementAsk, view: ClusterView, host: str, gpus: int) -> str | None:
        if view.hold(ask.job_id, host, gpus):
            return None
        return f"{view.free(host) if host in view.hosts else 0} free GPUs, {gpus} needed"

    def unreserve(self, ask: PlacementAsk, view: ClusterView, host: str) -> None:
        view.release(ask.job_id, host)


class GangBarrier:
    """`gang-barrier` (Permit): a gang is admitted only when all of its members are reserved:
    `ask.hosts` distinct hosts, each holding `ask.gpus_per_host` GPUs for the job.

    allow   every member is reserved
    wait    fewer members hold a reservation (members reserved in several steps, e.g. a gang put
            together across cycles); the framework keeps what is held at most `timeout_s`
            (arg; the profile's permit timeout when 0) and then unreserves all of it
    reject  a member holds the wrong GPU count, or more hosts than asked are held
    Contract: reads `view.held(ask.job_id)` only.
    """

    def __init__(self, timeout_s: float) -> None:
        if timeout_s < 0:
            raise ValueError(f"timeout_s must be >= 0, not {timeout_s}")
        self.timeout_s = timeout_s or None

    def permit(self, ask: PlacementAsk, view: ClusterView, hosts: Sequence[str]) -> PermitVerdict:
        held = view.held(ask.job_id)
        wrong = [h for h, g in held.items() if g != ask.gpus_per_host]
        if wrong:
            got = held[wrong[0]]
            return PermitVerdict(kind="reject", reason=f"{wrong[0]} holds {got} GPUs, not {ask.gpus_per_host}")
        if len(held) > ask.hosts:
            return PermitVerdict(kind="reject", reason=f"{len(held)} hosts held for a gang of {ask.hosts}")
        if len(held) < ask.hosts:
            return PermitVerdict(
                kind="wait", reason=f"{len(held)} of {ask.hosts} members reserved", timeout_s=self.timeout_s
            )
        return PermitVerdict(kind="allow")


def make_reserve_gpus(args: Mapping[str, Any]) -> ReserveGpus:
    numeric_args(args, {})
    return ReserveGpus()


def make_gang_barrier(args: Mapping[str, Any]) -> GangBarrier:
    return GangBarrier(numeric_args(args, {"timeout_s": 0.0})["timeout_s"])
