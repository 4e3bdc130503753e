"""The attacker's plan (no containers): what it sends is what the threat allows and the checks expect.

The attacker holds one agent's own user. Each crafted message decodes as a message of the contract,
aimed at another agent's node; it goes on a subject that user may publish (its own node's), but is
not what that subject and key are for (so only the subject-and-type check stands between it and a
handler); every type of the contract but the subject's own is sent on each subject; and every
forbidden request, the other agent's node's news included, is outside that user's grants.
"""

from __future__ import annotations

from ibpool_proto import ALL_MESSAGES, decode, misaddressed
from ibpool_runtime.bus_permissions import PUBLISHES, agent_grant, agent_permissions

from .attack import ATTACK_TERM, MARK, USER, plan
from .invariants import subject_matches

MINE = agent_grant("chaos", 1, 4)
OTHER = agent_grant("chaos", 5, 4)
PLAN = plan("agent-1", MINE, OTHER.nodes[0], None, None, OTHER.durable)
GRANTS = agent_permissions("agent-1", MINE)["publish"]


def allowed(subject: str) -> bool:
    return any(subject_matches(a, subject) for a in GRANTS["allow"]) and not any(
        subject_matches(d, subject) for d in GRANTS.get("deny", [])
    )


def test_each_crafted_message_is_well_formed_and_misaddressed_on_a_subject_the_agent_may_use() -> None:
    roots = {m.subject_root() for m in PUBLISHES[USER]}
    types_per_root = {r: [m for m in ALL_MESSAGES if m.subject_root() != r] for r in roots}
    assert len(PLAN.crafted) == sum(len(t) for t in types_per_root.values())
    for c in PLAN.crafted:
        message = decode(c["data"].encode())
        assert message.source == MARK
        assert allowed(c["subject"]), c["subject"]
        assert misaddressed(message, c["subject"]) is not None, (type(message).__name__, c["subject"])
        if c["stored"]:
            assert c["headers"]["Nats-Expected-Stream"].startswith("IBPOOL_")
    propose = [decode(c["data"].encode()) for c in PLAN.crafted if '"fencing_term"' in c["data"]]
    assert propose and all(getattr(m, "fencing_term", None) == ATTACK_TERM for m in propose)


def test_every_forbidden_request_is_outside_the_agents_grants() -> None:
    whats = {f["what"] for f in PLAN.forbidden}
    assert {"report telemetry of another agent's node", "end a job on another agent's node"} <= whats
    for f in PLAN.forbidden:
        assert not allowed(f["subject"]), f["what"]


def test_the_agents_own_user_may_publish_its_nodes_news_and_read_its_durable_only() -> None:
    for node in MINE.nodes:
        assert allowed(f"ibpool.node.telemetry.reported.{node}") and allowed(f"ibpool.job.job.exited.{node}")
    assert allowed(f"$JS.API.CONSUMER.MSG.NEXT.IBPOOL_POOL.{MINE.durable}")
    for node in OTHER.nodes:
        assert not allowed(f"ibpool.node.telemetry.reported.{node}")
    assert not allowed(f"$JS.API.CONSUMER.MSG.NEXT.IBPOOL_POOL.{OTHER.durable}")
    assert not allowed("ibpool.dlq.pool-allocator-commands") and allowed(f"ibpool.dlq.{MINE.durable}")
