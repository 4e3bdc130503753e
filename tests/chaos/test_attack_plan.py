"""The attacker's plan (no containers): what it sends is what the threat allows and the checks expect.

Each crafted message decodes as a message of the contract, aimed at the victims; it goes on a
subject the node agent's user may publish, but not the one its own type and key build (so only the
subject-and-type check stands between it and a handler); every type of the contract but the
subject's own is sent on each subject; and every forbidden request is outside that user's grants.
"""

from __future__ import annotations

from ibpool_proto import ALL_MESSAGES, decode, misaddressed
from ibpool_runtime.bus_permissions import PUBLISHES, permissions

from .attack import ATTACK_TERM, MARK, USER, plan
from .invariants import subject_matches


def test_each_crafted_message_is_well_formed_and_misaddressed_on_a_subject_the_agent_may_use() -> None:
    p = plan("chaos-001", None, None)
    own = PUBLISHES[USER]
    assert len(p.crafted) == len(own) * (len(ALL_MESSAGES) - 1)
    kinds_per_subject: dict[str, set[str]] = {}
    for c in p.crafted:
        message = decode(c["data"].encode())
        assert message.source == MARK
        assert any(subject_matches(cls.subject_pattern(), c["subject"]) for cls in own), c["subject"]
        assert misaddressed(message, c["subject"]) is not None, (type(message).__name__, c["subject"])
        kinds_per_subject.setdefault(c["subject"].rsplit(".", 1)[0], set()).add(type(message).__name__)
        if c["stored"]:
            assert c["headers"]["Nats-Expected-Stream"].startswith("IBPOOL_")
    assert all(len(kinds) == len(ALL_MESSAGES) - 1 for kinds in kinds_per_subject.values())
    propose = [decode(c["data"].encode()) for c in p.crafted if '"fencing_term"' in c["data"]]
    assert propose and all(getattr(m, "fencing_term", None) == ATTACK_TERM for m in propose)


def test_every_forbidden_request_is_outside_the_agents_grants() -> None:
    grants = permissions(USER)["publish"]
    for f in plan("chaos-001", None, None).forbidden:
        allowed = any(subject_matches(a, f["subject"]) for a in grants["allow"])
        denied = any(subject_matches(d, f["subject"]) for d in grants["deny"])
        assert not allowed or denied, f["what"]
