"""Arrivals and decode_arrivals: what the heartbeat-reading thread keeps and what a tick takes."""

from __future__ import annotations

import datetime as dt

from nats.aio.msg import Msg

from ibpool_proto import encode
from ibpool_proto.node import NodeHeartbeat
from ibpool_runtime.follow import Arrivals, decode_arrivals

T0 = dt.datetime(2026, 12, 5, tzinfo=dt.UTC)


def beat(node: str, seq: int, subject: str | None = None) -> Msg:
    hb = NodeHeartbeat(source="a", key=node, node_id=node, seq=seq, interval_s=1.0, occurred_at=T0)
    return Msg(_client=None, subject=subject or NodeHeartbeat.subject(node), data=encode(hb))  # type: ignore[arg-type]


def test_the_newest_of_each_subject_is_kept_until_taken_and_progress_only_moves_forward() -> None:
    a = Arrivals()
    for seq in (1, 2, 3):
        a.arrived(beat("n1", seq))
    a.arrived(beat("n2", 1))
    a.heard(100.0)
    a.heard(50.0)  # an older report does not move it back
    taken, heard = a.take()
    assert sorted(m.subject for _, m in taken) == sorted([NodeHeartbeat.subject("n1"), NodeHeartbeat.subject("n2")])
    decoded, _ = decode_arrivals(taken)
    assert sorted((b.node_id, b.seq) for b in decoded if isinstance(b, NodeHeartbeat)) == [("n1", 3), ("n2", 1)]
    assert heard >= 100.0
    assert a.take()[0] == []  # taken: gone


def test_a_beat_on_another_nodes_subject_or_undecodable_is_left_out_and_lateness_is_measured() -> None:
    a = Arrivals()
    a.arrived(beat("n1", 1, subject=NodeHeartbeat.subject("n9")))  # n1's body on n9's subject
    a.arrived(Msg(_client=None, subject=NodeHeartbeat.subject("n3"), data=b"{not json"))  # type: ignore[arg-type]
    a.arrived(beat("n2", 1))
    decoded, late = decode_arrivals(a.take()[0])
    assert [b.node_id for b in decoded if isinstance(b, NodeHeartbeat)] == ["n2"]
    # It "occurred" at T0 and arrived now: as late as that.
    assert late >= (dt.datetime.now(dt.UTC) - T0).total_seconds() - 5
