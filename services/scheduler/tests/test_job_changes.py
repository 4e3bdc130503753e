"""`pool_cycle.job_changes`: what a cycle's plan does to the job records, decided in the core
(the service only writes the result under its conditional update and sends the events)."""

from __future__ import annotations

import datetime as dt

from ibpool_core.sched.cycle import CycleConfig
from ibpool_core.sched.lifecycle import LifecycleConfig
from ibpool_core.sched.pool_cycle import ProposalStamp, job_changes, plan_cycle
from ibpool_core.sched.queueing import make_policy
from ibpool_proto.pool import ProposePlacement

from .test_glue import T0, job, ledger_of, node

STAMP = ProposalStamp(source="scheduler-1", group="main", lease_s=120.0, term=4)


def test_a_start_is_proposed_a_wait_is_explained_and_an_unchanged_wait_is_not_written() -> None:
    ledger = ledger_of(node("a"), node("b"))
    live = [job("fits", 8), job("too-big", 8, 3, at=1)]
    now = T0 + dt.timedelta(seconds=5)
    plan = plan_cycle(ledger, live, now, make_policy("fifo"), CycleConfig(), "ibpool.io/leaf")
    by_id = {j.job_id: j for j in live}
    changes = job_changes(plan, by_id, now, LifecycleConfig(source="scheduler-1"), STAMP)
    assert set(changes) == {"fits", "too-big"}
    old, new, events = changes["fits"]
    assert old is by_id["fits"] and new.state == "proposed"
    (cmd,) = events
    assert isinstance(cmd, ProposePlacement)
    assert (cmd.source, cmd.scheduler_group, cmd.lease_s, cmd.fencing_term) == ("scheduler-1", "main", 120.0, 4)
    assert cmd.assignments == new.proposal and cmd.id == new.proposal_id
    assert cmd.ledger_version == plan.ledger_version
    _, waiting, none = changes["too-big"]
    assert none == [] and waiting.wait_code == plan.waiting["too-big"].code == "unresolvable"
    assert waiting.reason == plan.waiting["too-big"].text()
    # The next cycle reads what was written: the same wait changes nothing.
    again = job_changes(plan, {**by_id, "too-big": waiting}, now, LifecycleConfig(source="scheduler-1"), STAMP)
    assert "too-big" not in again


def test_leases_with_less_than_half_left_are_due_for_renewal() -> None:
    from ibpool_core.pool.ledger import Allocation
    from ibpool_core.sched.pool_cycle import leases_due

    now = T0 + dt.timedelta(hours=1)

    def alloc(name: str, left_s: float) -> Allocation:
        return Allocation(
            allocation_id=f"a-{name}",
            command_id=f"a-{name}",
            job_id=name,
            tenant="t",
            queue="q",
            kind="whole",
            nodes=("n1",),
            grants=(),
            lease_expires_at=now + dt.timedelta(seconds=left_s),
        )

    held = {name: job(name, 1, state="running", allocation_id=f"a-{name}") for name in ("soon", "later", "edge")}
    allocations = {a.allocation_id: a for a in (alloc("soon", 100), alloc("later", 200), alloc("edge", 150))}
    queued = job("queued", 1, allocation_id="a-soon")  # not holding: never renewed
    due = leases_due([*held.values(), queued], allocations, now, lease_s=300)
    assert due == [("soon", "a-soon"), ("edge", "a-edge")]
    assert leases_due([job("gone", 1, state="running", allocation_id="a-x")], allocations, now, 300) == []
