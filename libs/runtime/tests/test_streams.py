import pytest

from ibpool_proto import ALL_MESSAGES
from ibpool_runtime.streams import DLQ_STREAM, STREAMS, stream_for_subject


def test_every_stored_message_subject_has_exactly_one_stream_and_an_unstored_one_none() -> None:
    unstored = [m for m in ALL_MESSAGES if not m.stored]
    assert [m.__name__ for m in unstored] == ["NodeHeartbeat"]
    for m in ALL_MESSAGES:
        subject = m.subject("k1")
        holders = [s.name for s in STREAMS for p in s.subjects if subject.startswith(p.removesuffix(">"))]
        assert len(holders) == (1 if m.stored else 0), (m, holders)
        if m.stored:
            assert stream_for_subject(subject) == holders[0] != DLQ_STREAM


def test_unknown_subject_is_a_clear_error() -> None:
    with pytest.raises(KeyError, match="no ibpool stream"):
        stream_for_subject("other.thing")
