"""Why a job waits, as a typed status (as the Kubernetes scheduler framework's Status codes), with the
words for a person rendered from it. Pure data.

Codes:

    unschedulable   it does not fit now; it will when running jobs end (`start_at`: the earliest
                    estimated start, when the cycle made a reservation for it; `no_free_gpus`: no
                    GPU at all was free, so the cycle looked no further)
    unresolvable    no release of running jobs lets it start on the current hosts (too few hosts of
                    its shape, a tier no group of the fabric is big enough for, a GPU model or a
                    dataset no host has): only new hosts can
    reservation     it waits for the reservation another job holds (`behind`): it fits no GPUs the
                    reservation leaves (`delays` False) or would delay that job's start (`delays` True)
    over_quota      the pool allocator refused its placement for its tenant's or queue's quota

A caller decides on the code, never on the words: `text()` is for people (the job's `reason`).
"""

from __future__ import annotations

import datetime as dt
from typing import Literal

import msgspec

WaitCode = Literal["unschedulable", "unresolvable", "reservation", "over_quota"]


def clock_text(t: float) -> str:
    """A POSIX time as the reasons write it: "2026-12-02 14:05" (UTC)."""
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%d %H:%M")


class Wait(msgspec.Struct, frozen=True, kw_only=True):
    """Why one job waits (see the module docstring).

    needs      what it needs, in words ("2 hosts with 8 free GPUs", "4 GPUs on one host")
    span       how it must sit on the fabric, in words (" under 1 leaves"), when the reason says it
    start_at   unschedulable with a reservation: its earliest estimated start (POSIX s)
    behind     reservation: the job holding it
    delays     reservation: it would delay that job's start (else: it fits nothing the reservation leaves)
    found      what placement found missing (the placer's own finding), when it said
    """

    code: WaitCode
    needs: str = ""
    span: str = ""
    no_free_gpus: bool = False
    start_at: float | None = None
    behind: str | None = None
    delays: bool = False
    found: str = ""

    def text(self) -> str:
        """The reason in words, for a person."""
        match self.code:
            case "reservation":
                lead = "would delay" if self.delays else "waiting behind"
                out = f"{lead} the reservation of {self.behind}"
            case "unschedulable" if self.no_free_gpus:
                out = "no free GPUs"
            case "unschedulable":
                out = f"waiting for {self.needs}{self.span}"
                if self.start_at is not None:
                    out += f"; earliest estimated start {clock_text(self.start_at)}"
            case "unresolvable":
                out = f"waiting for {self.needs}; never fits the current hosts"
            case "over_quota":
                out = f"over quota: {self.found}"
                return out
        return f"{out} ({self.found})" if self.found else out

    def with_found(self, found: str) -> Wait:
        """The same wait, saying what placement found missing."""
        return msgspec.structs.replace(self, found=found)
