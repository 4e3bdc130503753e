"""Small helpers the integration tests share: waiting for a condition, reading a stream."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from nats.js.api import ConsumerConfig, DeliverPolicy
from nats.js.client import JetStreamContext


async def eventually(check: Callable[[], Awaitable[bool]], timeout_s: float = 20.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{what} did not hold within {timeout_s}s")


async def stream_messages(js: JetStreamContext, stream: str, subject: str, limit: int = 10_000) -> list:
    """Every message stored in `stream` on `subject` (an ephemeral ordered read, no acks)."""
    sub = await js.pull_subscribe(
        subject,
        stream=stream,
        config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL, inactive_threshold=5.0),
    )
    out: list = []
    try:
        # Read what was stored when we looked, not what keeps arriving (heartbeats never stop).
        wanted = min(limit, (await sub.consumer_info()).num_pending)
        while len(out) < wanted:
            batch = await sub.fetch(min(256, wanted - len(out)), timeout=5)
            for m in batch:
                await m.ack()
            out.extend(batch)
    finally:
        await sub.unsubscribe()
    return out
