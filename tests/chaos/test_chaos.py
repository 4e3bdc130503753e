"""Chaos in containers: kill, pause and cut off parts of the system while jobs flow; nothing may break.

Each scenario is a list of faults on a timeline (seconds from the start of the load, see
`scenario.Fault`); `scenario.run` drives the load and checks the invariants (`invariants.py`):
no GPU share granted twice (from the event log and from the allocator's ledger), no job held
twice, every job completed, work on a killed agent requeued and re-granted, an outside subscriber
saw every allocation event, no outbox left unsent, the DLQ holds exactly the malformed flood, and
every container healthy again without help. The bus runs as deployed: TLS, a NATS user per service,
signed grants (system.py).

`make test` runs the four marked `chaos_smoke` (a service kill, an agent kill, a NATS node kill, an
attacker holding an agent's credentials); `make chaos` runs all and writes docs/reliability.md.
"""

from __future__ import annotations

import pytest

from .scenario import Fault, Outcome, run
from .system import Layout, System

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(1500)]


async def _check(name: str, system: System, faults: list[Fault], outcomes: list[Outcome], **kw: object) -> None:
    outcome = await run(name, system, faults, **kw)  # type: ignore[arg-type]
    outcomes.append(outcome)
    assert outcome.held, outcome.failures()


@pytest.mark.chaos_smoke
async def test_each_service_killed_in_turn(system: System, outcomes: list[Outcome]) -> None:
    faults = [
        Fault(2, "kill", "allocator"),
        Fault(5, "start", "allocator"),
        Fault(7, "kill", "scheduler-leader"),
        Fault(10, "start", "scheduler-leader"),
        Fault(11, "kill", "failover"),
        Fault(13, "start", "failover"),
        Fault(14, "kill", "fabric-monitor"),
        Fault(15, "kill", "autoscaler"),
        Fault(17, "start", "fabric-monitor"),
        Fault(18, "start", "autoscaler"),
    ]
    await _check("each service SIGKILLed in turn", system, faults, outcomes)


@pytest.mark.chaos_smoke
async def test_an_agent_killed_under_load(system: System, outcomes: list[Outcome]) -> None:
    """The agent with the most work is SIGKILLed: its nodes fail (4 of 8, within the 50% limit), their
    jobs are requeued and granted on the other agent's nodes, and the agent comes back."""
    await _check("node agent SIGKILLed", system, [Fault(6, "kill", "busy-agent"), Fault(14, "start", "busy-agent")],
                 outcomes)  # fmt: skip


@pytest.mark.chaos_smoke
async def test_a_nats_node_killed_and_restarted(system: System, outcomes: list[Outcome]) -> None:
    faults = [Fault(4, "kill", "nats-2"), Fault(12, "start", "nats-2")]
    await _check("NATS node SIGKILLed and restarted", system, faults, outcomes)


async def test_the_pool_stream_leader_killed(system: System, outcomes: list[Outcome]) -> None:
    faults = [Fault(4, "kill", "stream-leader"), Fault(12, "start", "stream-leader")]
    await _check("NATS leader of the pool stream SIGKILLed", system, faults, outcomes)


async def test_a_nats_node_partitioned(system: System, outcomes: list[Outcome]) -> None:
    faults = [Fault(4, "disconnect", "nats-3"), Fault(12, "connect", "nats-3")]
    await _check("NATS node partitioned off", system, faults, outcomes)


async def test_everything_killed_at_once(system: System, outcomes: list[Outcome]) -> None:
    parts: tuple[str, ...] = ("fabric-monitor", "allocator", "scheduler-1", "scheduler-2", "failover", "autoscaler")
    parts += ("agent-1", "agent-2")
    faults = [Fault(5, "kill", p) for p in parts] + [Fault(9, "start", p) for p in parts]
    await _check("every service and agent SIGKILLed at once", system, faults, outcomes)


async def test_postgres_restarted(system: System, outcomes: list[Outcome]) -> None:
    await _check("Postgres restarted", system, [Fault(5, "restart", "postgres")], outcomes)


async def test_the_scheduler_leader_paused_past_its_lease(system: System, outcomes: list[Outcome]) -> None:
    """`docker pause` freezes the leader for twice its 5 s lease: the other replica takes over with a
    higher term; the old one wakes still believing it leads, and the allocator refuses its terms."""
    faults = [Fault(4, "pause", "scheduler-leader"), Fault(14, "unpause", "scheduler-leader")]
    await _check("scheduler leader paused past its lease", system, faults, outcomes, extra=("fencing",))


@pytest.mark.parametrize("system", [Layout(agents=10, nodes_per_agent=1)], indirect=True)
async def test_ten_percent_of_agents_killed_at_once(system: System, outcomes: list[Outcome]) -> None:
    """Ten agents of one node each; one in ten (the busiest) killed at once, restarted later."""
    await _check("10% of node agents SIGKILLed", system, [Fault(6, "kill", "busy-agent"),
                                                          Fault(14, "start", "busy-agent")], outcomes)  # fmt: skip


@pytest.mark.parametrize("system", [Layout(max_failed_fraction=0.2)], indirect=True)
async def test_a_partitioned_agent_is_not_mass_failed(system: System, outcomes: list[Outcome]) -> None:
    """Half the nodes unreachable is more than the 20% the controller may fail at once: ClusterDegraded,
    no node failed, no requeue; their work goes on once the partition heals."""
    faults = [Fault(4, "disconnect", "agent-2"), Fault(16, "connect", "agent-2")]
    await _check("node agent partitioned off (half the nodes)", system, faults, outcomes, extra=("degraded",))


async def test_a_flood_of_malformed_events(system: System, outcomes: list[Outcome]) -> None:
    await _check("malformed events flooded on every subject", system, [Fault(4, "flood")], outcomes)


@pytest.mark.chaos_smoke
@pytest.mark.parametrize("system", [Layout(random_gpu_faults=False)], indirect=True)
async def test_an_attacker_with_an_agents_credentials(system: System, outcomes: list[Outcome]) -> None:
    """From its own container, with agent 1's own NATS user, the attacker publishes every type of the
    contract on every subject that user may publish (type confusion, aimed at agent 2's busy node
    and a live allocation), tries what the user may not (news of agent 2's node, reading its
    durable, a forged and a replayed grant, a node failure, a fencing term of 10^9, deleting or
    reading the allocator's durable, snooping on others' replies), while the load runs: the servers
    refuse what is not its own, the consumers dead-letter the rest, and nothing it sent takes effect."""
    await _check("attacker with a node agent's credentials", system, [Fault(4, "attack")], outcomes)
