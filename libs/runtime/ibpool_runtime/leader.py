"""Leader election over a NATS KV bucket with a TTL, and the term that fences a deposed leader.

The leader is whoever created the key: `create` succeeds only while the key is absent, and the
bucket's TTL removes a key its holder stopped renewing (a crashed or partitioned leader). All keys
share one bucket (`ibpool_leaders`) so that terms are revisions of one stream; its TTL is the one
of the first replica that created it. The
holder renews with `update(last=revision)` every `ttl_s / 3`; a renewal that fails (someone else
holds the key now, or the bus is gone) ends the leadership at once. The term is the key's revision
when it was won: revisions only grow, so a newer leader always has a higher term. Elections alone
cannot stop a deposed leader that has not noticed yet from writing, so every decision it commits
also checks the term against the highest one stored (the failover controller's `state.fence`, the
scheduler's `state.lock_cycle`, and the pool allocator for the scheduler's proposals): a lower term
is refused. Shared by every service that
elects one active replica (failover controller, scheduler).
"""

from __future__ import annotations

import asyncio
import contextlib

import nats.errors
import nats.js.errors
from nats.js.api import KeyValueConfig
from nats.js.kv import KeyValue

from .bus import Bus
from .logs import get_logger
from .service import sleep_unless_stopped

log = get_logger(__name__)

BUCKET = "ibpool_leaders"


class Leadership:
    def __init__(self, bus: Bus, key: str, identity: str, ttl_s: float, replicas: int = 1) -> None:
        self.bus = bus
        self.key = key
        self.identity = identity
        self.ttl_s = ttl_s
        self.replicas = replicas
        self.term: int | None = None
        self._revision: int | None = None
        self._kv: KeyValue | None = None

    @property
    def is_leader(self) -> bool:
        return self.term is not None

    async def bucket(self) -> KeyValue:
        """The leaders' bucket; its TTL is set by whoever created it, and every holder renews by that one."""
        if self._kv is None:
            try:
                kv = await self.bus.js.key_value(BUCKET)
            except nats.js.errors.BucketNotFoundError:
                config = KeyValueConfig(bucket=BUCKET, ttl=self.ttl_s, history=1, replicas=self.replicas)
                kv = await self.bus.js.create_key_value(config)
            # One bucket for every key keeps terms comparable; a TTL that differs from ours wins.
            ttl = (await kv.status()).ttl
            if ttl and abs(ttl - self.ttl_s) > 1e-3:
                log.warning("leader bucket has another TTL; renewing by it", bucket_ttl_s=ttl, configured_s=self.ttl_s)
                self.ttl_s = ttl
            self._kv = kv
        return self._kv

    async def campaign_once(self) -> bool:
        """Win the key if it is free, or renew it if held; True while this instance leads."""
        kv = await self.bucket()
        value = self.identity.encode()
        if self._revision is None:
            try:
                self._revision = await kv.create(self.key, value)
            except nats.js.errors.KeyWrongLastSequenceError:
                return False
            self.term = self._revision
            log.info("leadership won", key=self.key, term=self.term)
            return True
        try:
            self._revision = await kv.update(self.key, value, last=self._revision)
        except (nats.js.errors.KeyWrongLastSequenceError, nats.js.errors.KeyNotFoundError):
            self.step_down("another instance holds the key")
            return False
        return True

    def step_down(self, why: str) -> None:
        if self.term is not None:
            log.warning("leadership lost", key=self.key, term=self.term, why=why)
        self.term = None
        self._revision = None

    async def run(self, stop: asyncio.Event) -> None:
        """Campaign and renew every ttl/3 until `stop`; then resign so a standby takes over at once."""
        try:
            while not stop.is_set():
                try:
                    await self.campaign_once()
                except (nats.errors.Error, nats.js.errors.Error, TimeoutError, OSError) as e:
                    # Not knowing is not leading: a renewal we cannot make may already have expired.
                    self.step_down(f"bus error: {str(e) or type(e).__name__}")
                await sleep_unless_stopped(stop, self.ttl_s / 3)
        finally:
            await self.resign()

    async def resign(self) -> None:
        if self._revision is not None and self._kv is not None:
            with contextlib.suppress(Exception):
                await self._kv.delete(self.key, last=self._revision)
        self.step_down("resigned")


def role(leadership: Leadership | None) -> str:
    """What the service API shows: "leader" or "standby" where replicas elect one, "active" otherwise."""
    if leadership is None:
        return "active"
    return "leader" if leadership.is_leader else "standby"
