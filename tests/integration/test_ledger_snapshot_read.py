"""A ledger replica reads the snapshot it starts from (an object of the JetStream object store) whole,
however many flow-control windows it spans.

nats-server pushes the chunks of an object to the reader's ordered consumer a window at a time and
waits for the reader's answer to its flow-control message before the next. `read_object` takes the
chunks with `next_msg`, which answers at once (nats.py's `async for msg in sub.messages` leaves the
answer to a poller that runs every 0.25 s: the 9 MB snapshot of 1,000 busy nodes took 530 ms to read
instead of 25). How long a read takes is measured by tests/bench/bench_snapshot.py, not here.
"""

from __future__ import annotations

import os

from ibpool_runtime.bus import Bus
from ibpool_runtime.ledger_replica import read_object
from tests.integration.pool_support import unique

# Several flow-control windows of 128 KB chunks.
SIZE = 16 * 1024 * 1024


async def test_an_object_of_several_flow_control_windows_is_read_whole(bus: Bus) -> None:
    bucket = unique("objfc").replace("-", "_")
    store = await bus.js.create_object_store(bucket)
    data = os.urandom(SIZE)
    await store.put("snapshot", data)
    try:
        assert await read_object(bus, bucket, "snapshot") == data
        assert await read_object(bus, bucket, "missing") is None
    finally:
        await bus.js.delete_object_store(bucket)
