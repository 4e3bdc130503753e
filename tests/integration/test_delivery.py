"""At-least-once delivery, exactly-once effect: duplicates, naks and poison messages."""

from __future__ import annotations

import asyncio
import datetime as dt
import uuid

import msgspec
import pytest

from ibpool_proto import new_id
from ibpool_proto.job import CancelJob, JobSpec, SubmitJob
from ibpool_proto.pool import ResourceRequest
from ibpool_runtime.bus import Bus, envelope_headers
from ibpool_runtime.config import BaseConfig
from ibpool_runtime.consumer import Consumer, ConsumerSettings, HandlerContext, HandlerFailed, Handoff, Subscription
from ibpool_runtime.metrics import ServiceMetrics
from ibpool_runtime.service import Kit, Service, ServiceSpec
from ibpool_runtime.store import Store
from ibpool_runtime.streams import DLQ_STREAM
from tests.integration.helpers import eventually, stream_messages


def cancel(job_id: str) -> CancelJob:
    return CancelJob(source="test", key=job_id, job_id=job_id, reason="test")


async def effects_table(store: Store) -> None:
    await store.pool.execute("CREATE TABLE IF NOT EXISTS effects (event_id text, job_id text)")


async def count_effects(store: Store, job_id: str) -> int:
    return int(await store.pool.fetchval("SELECT count(*) FROM effects WHERE job_id = $1", job_id))


class Recorder:
    """A handler that writes one row per event it sees; `fail_first` fails every first delivery."""

    def __init__(self, fail_first: bool = False, always_fail_for: str | None = None) -> None:
        self.fail_first = fail_first
        self.always_fail_for = always_fail_for
        self.calls = 0

    async def __call__(self, event: CancelJob, ctx: HandlerContext) -> None:
        self.calls += 1
        assert ctx.tx is not None
        await ctx.tx.conn.execute("INSERT INTO effects VALUES ($1, $2)", event.id, event.job_id)
        if self.always_fail_for == event.job_id:
            raise RuntimeError("this handler always fails for " + event.job_id)
        if self.fail_first and ctx.deliveries == 1:
            raise RuntimeError("transient failure on the first delivery")


async def start_consumer(
    bus: Bus, store: Store, handler, job_ids: list[str], prepare=None, handoff=None, **settings
) -> tuple[Consumer, asyncio.Event, asyncio.Task]:
    durable = f"test-{uuid.uuid4().hex[:8]}"
    subjects = tuple(CancelJob.subject(j) for j in job_ids)
    sub = Subscription(durable=durable, filter_subjects=subjects, handler=handler, prepare=prepare, handoff=handoff)
    consumer = Consumer(bus, store, sub, ConsumerSettings(**settings), ServiceMetrics("test"), "test")
    await consumer.start()
    stop = asyncio.Event()
    task = asyncio.create_task(consumer.run(stop))
    return consumer, stop, task


async def test_same_event_three_times_and_a_nak_changes_state_once(bus: Bus, store: Store) -> None:
    await effects_table(store)
    job = f"job-{uuid.uuid4().hex[:8]}"
    event = cancel(job)
    recorder = Recorder(fail_first=True)
    consumer, stop, task = await start_consumer(bus, store, recorder, [job], batch=8)
    body = msgspec.json.encode(event)
    # Three copies of one event, two with their own Nats-Msg-Id so JetStream stores all three
    # (as after a producer crash outside the dedup window): only the inbox can stop them.
    await bus.publish(event)
    for i in range(2):
        headers = envelope_headers(event)
        headers["Nats-Msg-Id"] = f"{event.id}-copy-{i}"
        await bus.js.publish(event.subject_of(), body, headers=headers)
    # And the same Nats-Msg-Id again: dropped by JetStream's duplicate window.
    ack = await bus.publish(event)
    assert ack.duplicate is True

    async def settled() -> bool:
        info = await bus.js.consumer_info(consumer.sub.stream_name(), consumer.sub.durable)
        return info.num_pending == 0 and info.num_ack_pending == 0

    await eventually(settled, what="all copies acked")
    stop.set()
    await task
    assert await count_effects(store, job) == 1
    # every copy failed on its first delivery (nak'd, redelivered); on redelivery one took
    # effect and the inbox recognised the other two
    assert consumer.metrics.failed.labels(consumer.sub.durable, event.ce_type())._value.get() == 3
    assert consumer.metrics.duplicates.labels(consumer.sub.durable)._value.get() == 2
    assert consumer.metrics.handled.labels(consumer.sub.durable, event.ce_type())._value.get() == 1


async def test_poison_message_and_failing_handler_go_to_dlq_and_consumer_goes_on(bus: Bus, store: Store) -> None:
    await effects_table(store)
    bad_job, good_job = f"bad-{uuid.uuid4().hex[:8]}", f"good-{uuid.uuid4().hex[:8]}"
    recorder = Recorder(always_fail_for=bad_job)
    consumer, stop, task = await start_consumer(bus, store, recorder, [bad_job, good_job], max_deliver=3, batch=4)
    # 1. bytes that are not a message at all
    await bus.js.publish(CancelJob.subject(bad_job), b"\x00not json{", headers={"Nats-Msg-Id": new_id()})
    # 2. valid JSON of an unknown type
    await bus.js.publish(CancelJob.subject(bad_job), b'{"type":"io.ibpool.nope.v1"}', headers={"Nats-Msg-Id": new_id()})
    # 3. a message whose handler always raises
    poisoned = cancel(bad_job)
    await bus.publish(poisoned)
    # then good messages that must still be handled
    goods = [cancel(good_job) for _ in range(5)]
    for g in goods:
        await bus.publish(g)

    dlq_subject = f"ibpool.dlq.{consumer.sub.durable}"

    async def all_dead() -> bool:
        return len(await stream_messages(bus.js, DLQ_STREAM, dlq_subject)) >= 3

    await eventually(lambda: _count_is(store, good_job, 5), what="good messages handled")
    await eventually(all_dead, timeout_s=30, what="three messages dead-lettered")
    stop.set()
    await task
    dead = await stream_messages(bus.js, DLQ_STREAM, dlq_subject)
    reasons = sorted(m.headers["ibpool-dlq-reason"] for m in dead)
    assert sum(r.startswith("decode:") for r in reasons) == 2, reasons
    handler_dead = [m for m in dead if m.headers["ibpool-dlq-reason"].startswith("handler failed")]
    assert len(handler_dead) == 1
    h = handler_dead[0].headers
    assert "always fails" in h["ibpool-dlq-reason"]
    assert h["ibpool-dlq-subject"] == CancelJob.subject(bad_job)
    assert h["ibpool-dlq-deliveries"] == "3"
    assert h["ce-id"] == poisoned.id
    assert handler_dead[0].data == msgspec.json.encode(poisoned)
    # the failing handler's writes were rolled back every time
    assert await count_effects(store, bad_job) == 0
    assert await count_effects(store, good_job) == 5


async def _count_is(store: Store, job: str, n: int) -> bool:
    return await count_effects(store, job) == n


async def test_handler_failure_rolls_back_only_its_own_event_in_a_batch(bus: Bus, store: Store) -> None:
    await effects_table(store)
    bad_job, good_job = f"bad-{uuid.uuid4().hex[:8]}", f"good-{uuid.uuid4().hex[:8]}"
    # Publish first, so one fetch brings both jobs' events in a single batch transaction.
    events = [cancel(good_job), cancel(bad_job), cancel(good_job)]
    for e in events:
        await bus.publish(e)
    recorder = Recorder(always_fail_for=bad_job)
    consumer, stop, task = await start_consumer(bus, store, recorder, [bad_job, good_job], max_deliver=2, batch=16)
    await eventually(lambda: _count_is(store, good_job, 2), what="both good events handled")
    stop.set()
    await task
    assert await count_effects(store, bad_job) == 0
    inbox = await store.pool.fetch("SELECT event_id FROM inbox WHERE consumer = $1", consumer.sub.durable)
    assert {r["event_id"] for r in inbox} == {events[0].id, events[2].id}


async def test_prepare_sees_the_batch_first_and_a_failing_one_falls_back_to_event_by_event(
    bus: Bus, store: Store
) -> None:
    await effects_table(store)
    jobs = [f"prep-{uuid.uuid4().hex[:8]}" for _ in range(3)]
    events = [cancel(j) for j in jobs]
    for e in events:
        await bus.publish(e)
    batches: list[list[str]] = []
    seen_ahead: list[bool] = []

    async def prepare(batch: list[CancelJob], tx) -> None:
        batches.append([e.job_id for e in batch])
        tx.scratch["ahead"] = True
        if len(batches) == 1:
            raise RuntimeError("the read-ahead failed")

    class Ahead(Recorder):
        async def __call__(self, event: CancelJob, ctx: HandlerContext) -> None:
            assert ctx.tx is not None
            seen_ahead.append(bool(ctx.tx.scratch.get("ahead")))
            await super().__call__(event, ctx)

    _consumer, stop, task = await start_consumer(bus, store, Ahead(), jobs, prepare=prepare, batch=16)
    await eventually(lambda: _count_is(store, jobs[2], 1), what="the batch handled after the failed prepare")
    for e in events[:2]:  # a second batch: prepare runs and its handlers see what it kept
        await bus.publish(cancel(e.job_id))
    await eventually(lambda: _count_is(store, jobs[1], 2), what="the second batch handled")
    stop.set()
    await task
    # The first batch: prepare saw every event, failed, and the batch ran one event at a time
    # without it (each handler once, nothing of the failed attempt kept).
    assert batches[0] == jobs and [await count_effects(store, j) for j in jobs] == [2, 2, 1]
    assert seen_ahead[:3] == [False, False, False]
    # Later batches had a prepare that held, and their handlers saw its scratch.
    assert len(batches) >= 2 and all(seen_ahead[3:]) and len(seen_ahead) == 5


async def _acked_all(bus: Bus, consumer: Consumer) -> bool:
    info = await bus.js.consumer_info(consumer.sub.stream_name(), consumer.sub.durable)
    return info.num_pending == 0 and info.num_ack_pending == 0


async def test_a_handoff_keeps_batches_unacked_until_the_taking_transaction_commits(bus: Bus, store: Store) -> None:
    await effects_table(store)
    jobs = [f"hand-{uuid.uuid4().hex[:8]}" for _ in range(4)]
    arrivals: list[int] = []
    accepting = True
    handoff = Handoff(lambda: accepting, lambda: arrivals.append(len(handoff.kept)))
    recorder = Recorder(always_fail_for=jobs[3])
    consumer, stop, task = await start_consumer(bus, store, recorder, jobs, handoff=handoff, batch=16, max_deliver=2)
    first = [cancel(jobs[0]), cancel(jobs[1])]
    for e in first:
        await bus.publish(e)
    await eventually(lambda: _true(len(handoff.kept) == 2), what="both events kept by the hand-off")
    assert arrivals and recorder.calls == 0  # kept, not handled
    info = await bus.js.consumer_info(consumer.sub.stream_name(), consumer.sub.durable)
    assert info.num_ack_pending == 2  # and not acked

    # Taken into a transaction of the service's own, with a write of its own: one commit for both.
    taken = handoff.take()
    async with store.transaction() as tx:
        await handoff.handle_in(tx, taken)
        await tx.conn.execute("INSERT INTO effects VALUES ('own', $1)", jobs[0])
    await handoff.settle(taken)
    await eventually(lambda: _acked_all(bus, consumer), what="the taken events acked after the commit")
    assert [await count_effects(store, j) for j in jobs[:2]] == [2, 1]

    # A taking transaction that rolls back (a handler failed): the events are handled apart, the
    # good one once, the failing one nak'd and in the end dead-lettered, nothing of the rollback kept.
    await bus.publish(cancel(jobs[2]))
    await bus.publish(cancel(jobs[3]))
    await eventually(lambda: _true(len(handoff.kept) == 2), what="the next two kept")
    taken = handoff.take()
    with pytest.raises(HandlerFailed):
        async with store.transaction() as tx:
            await tx.conn.execute("INSERT INTO effects VALUES ('own', $1)", jobs[2])
            await handoff.handle_in(tx, taken)
    accepting = False  # the redelivery of the failing one is handled by the consumer itself
    await handoff.handle_apart(taken)
    await eventually(lambda: _acked_all(bus, consumer), timeout_s=30, what="the failing event dead-lettered")
    assert [await count_effects(store, j) for j in jobs[2:]] == [1, 0]

    # Kept when the consumer stops: handled apart, not left for a redelivery.
    accepting = True
    await bus.publish(cancel(jobs[1]))
    await eventually(lambda: _true(len(handoff.kept) == 1), what="one more kept")
    stop.set()
    await task
    assert await count_effects(store, jobs[1]) == 2 and not handoff.kept
    assert await _acked_all(bus, consumer)


async def _true(value: bool) -> bool:
    return value


def test_occurred_at_is_utc() -> None:
    assert cancel("j").occurred_at.tzinfo == dt.UTC


pytestmark = pytest.mark.integration


async def test_inbox_rows_past_the_retention_are_pruned_by_the_running_service(bus: Bus, store: Store) -> None:
    # The inbox must not grow forever: ids handled longer ago than the retention go (in chunks),
    # newer ones stay and still stop their duplicates.
    old = [f"old-{i}" for i in range(25)]
    await store.pool.executemany(
        "INSERT INTO inbox (consumer, event_id, handled_at) VALUES ('c', $1, now() - interval '2 hours')",
        [(e,) for e in old],
    )
    async with store.transaction() as tx:
        assert await tx.mark_handled("c", "new")
    assert await store.prune_inbox(3600, chunk=10) == 25  # three statements: 10, 10, 5
    assert [r["event_id"] for r in await store.pool.fetch("SELECT event_id FROM inbox")] == ["new"]
    async with store.transaction() as tx:
        assert not await tx.mark_handled("c", "new")  # a duplicate of a kept id is still caught

    # The service prunes on its own, every `inbox_prune_interval_s`.
    await store.pool.execute(
        "INSERT INTO inbox (consumer, event_id, handled_at) VALUES ('c', 'older', now() - interval '2 hours')"
    )
    cfg = BaseConfig(inbox_retention_s=3600, inbox_prune_interval_s=0.1)
    service = Service(Kit(name="t", config=cfg, bus=bus, store=store, metrics=ServiceMetrics("t")), ServiceSpec())
    await service.start()
    try:

        async def pruned() -> bool:
            return await store.pool.fetchval("SELECT count(*) FROM inbox WHERE event_id = 'older'") == 0

        await eventually(pruned, timeout_s=10, what="the service pruned the old inbox row")
        assert await store.pool.fetchval("SELECT count(*) FROM inbox") == 1
    finally:
        await service.stop()


async def test_a_body_on_another_types_subject_or_key_is_dead_lettered_before_any_handler(
    bus: Bus, store: Store
) -> None:
    """Subject and type are one: what a publisher may send on a subject it is allowed to use is only
    the message that subject is for (a stolen credential cannot pass one command off as another)."""
    await effects_table(store)
    job, other = f"job-{uuid.uuid4().hex[:8]}", f"other-{uuid.uuid4().hex[:8]}"
    recorder = Recorder()
    consumer, stop, task = await start_consumer(bus, store, recorder, [job], batch=8)
    crafted = [
        # another type's body on this consumer's subject (the type tag decides the decoding)
        SubmitJob(
            source="attacker",
            key=job,
            job_id=job,
            spec=JobSpec(name="x", tenant="t", request=ResourceRequest(kind="whole")),
        ),
        # the right type, but naming another job than its subject's key
        CancelJob(source="attacker", key=other, job_id=other, reason="x"),
    ]
    for m in crafted:
        await bus.js.publish(CancelJob.subject(job), msgspec.json.encode(m), headers={"Nats-Msg-Id": new_id()})
    # the right body and subject, with a ce-type header of another type
    spoofed = cancel(job)
    headers = envelope_headers(spoofed) | {"ce-type": SubmitJob.ce_type()}
    await bus.js.publish(spoofed.subject_of(), msgspec.json.encode(spoofed), headers=headers)
    good = cancel(job)
    await bus.publish(good)
    dlq_subject = f"ibpool.dlq.{consumer.sub.durable}"

    async def all_dead() -> bool:
        return len(await stream_messages(bus.js, DLQ_STREAM, dlq_subject)) >= 3

    await eventually(lambda: _count_is(store, job, 1), what="the well-addressed message handled")
    await eventually(all_dead, what="three misaddressed messages dead-lettered")
    stop.set()
    await task
    reasons = sorted(m.headers["ibpool-dlq-reason"] for m in await stream_messages(bus.js, DLQ_STREAM, dlq_subject))
    assert len(reasons) == 3 and all(r.startswith("subject: ") for r in reasons), reasons
    assert any("a SubmitJob on " in r for r in reasons) and any("header ce-type" in r for r in reasons)
    assert recorder.calls == 1  # only the good one reached the handler
    assert consumer.metrics.dead_lettered.labels(consumer.sub.durable, "subject")._value.get() == 3


async def test_a_message_carrying_jetstream_steering_headers_still_reaches_the_dlq(bus: Bus, store: Store) -> None:
    """A poison message with `Nats-Expected-Stream` (its own stream's, so it was stored) is
    dead-lettered with that header renamed, instead of the DLQ refusing the copy (it is not that
    stream) and the message being dropped after its last try."""
    await effects_table(store)
    job = f"bad-{uuid.uuid4().hex[:8]}"
    consumer, stop, task = await start_consumer(bus, store, Recorder(), [job], max_deliver=2, batch=4)
    steering = {"Nats-Expected-Stream": "IBPOOL_JOB"}
    await bus.js.publish(CancelJob.subject(job), b"{not json", headers={"Nats-Msg-Id": new_id(), **steering})
    dlq_subject = f"ibpool.dlq.{consumer.sub.durable}"

    async def dead() -> bool:
        return len(await stream_messages(bus.js, DLQ_STREAM, dlq_subject)) == 1

    await eventually(dead, what="the message in the DLQ")
    stop.set()
    await task
    (letter,) = await stream_messages(bus.js, DLQ_STREAM, dlq_subject)
    assert letter.headers["ibpool-dlq-header-Nats-Expected-Stream"] == "IBPOOL_JOB"
    assert "Nats-Expected-Stream" not in letter.headers
    assert not [h for h in letter.headers if h.lower().startswith("nats-expected")]
    assert consumer.metrics.dead_letter_failures.labels(consumer.sub.durable)._value.get() == 0


async def test_a_deleted_durable_is_made_again_and_nothing_after_its_ack_floor_is_lost(bus: Bus, store: Store) -> None:
    await effects_table(store)
    job = f"job-{uuid.uuid4().hex[:8]}"
    consumer, stop, task = await start_consumer(bus, store, Recorder(), [job], batch=8)
    await bus.publish(cancel(job))
    await eventually(lambda: _count_is(store, job, 1), what="the first message handled")
    await consumer.pending()  # the ack floor, as a metrics scrape reads it
    await bus.js.delete_consumer(consumer.sub.stream_name(), consumer.sub.durable)  # as an attacker could
    await bus.publish(cancel(job))
    await eventually(lambda: _count_is(store, job, 2), what="the message published after the deletion handled")
    stop.set()
    await task
    assert consumer.metrics.consumers_recreated.labels(consumer.sub.durable)._value.get() == 1
    assert not consumer.missing
    info = await bus.js.consumer_info(consumer.sub.stream_name(), consumer.sub.durable)
    assert info.config.durable_name == consumer.sub.durable
