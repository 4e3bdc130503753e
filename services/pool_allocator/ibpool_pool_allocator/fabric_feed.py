"""Where the allocator's fabric comes from: a topology file at start, then every `TopologyPublished`.

The fabric monitor announces each topology version with `TopologyPublished`, whose `url` serves
it (GET /v1/topology?version=N). On each announcement the feed fetches the topology (bounded by
`fabric_fetch_timeout_s`), indexes it in a worker thread and swaps it into the `FabricView` that
the placer (leaf groups for gangs) and `decide` (hops for remote grants) read. A fetch that fails
(unreachable, not 200, not a topology, content hash not the announced one) is logged with the URL
and the reason, the previous fabric stays, and the handler raises so the message is retried with
backoff and, after `consumer_max_deliver` attempts, dead-lettered with the reason. An announcement
of the topology already held, or of an older version, is acknowledged without a fetch.

Every replica needs the fabric, so the consumer is durable per instance (`<prefix>-fabric-<instance>`),
not shared. The view lives in memory: on start, `run` loads the newest announcement still in the
stream, so a restarted allocator does not wait for the next topology.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import aiohttp
import msgspec
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from prometheus_client import Counter

from ibpool_core.fabric.formats import import_topology
from ibpool_core.fabric.model import FabricError, Topology, content_hash
from ibpool_core.pool.fabric_view import FabricState, FabricView, fabric_state
from ibpool_proto import decode
from ibpool_proto.fabric import TopologyPublished
from ibpool_runtime.config import ConfigError
from ibpool_runtime.consumer import HandlerContext, Subscription
from ibpool_runtime.logs import get_logger
from ibpool_runtime.service import Kit
from ibpool_runtime.streams import stream_for_subject

from .config import PoolAllocatorConfig

log = get_logger(__name__)


class FabricFetchFailed(Exception):
    """A published topology could not be fetched or used; the message says which URL and why."""


def guess_format(path: Path, text: str) -> str:
    """native for .json/.yaml/.yml, slurm for a topology.conf, ibnetdiscover otherwise."""
    if path.suffix in (".json", ".yaml", ".yml"):
        return "native"
    if "SwitchName=" in text or "BlockName=" in text:
        return "slurm"
    return "ibnetdiscover"


def load_fabric_file(path: str, fmt: str = "auto") -> FabricState:
    """The fabric of a topology file; ConfigError naming the file and what is wrong."""
    p = Path(path)
    try:
        text = p.read_text()
        kind = guess_format(p, text) if fmt == "auto" else fmt
        topology = import_topology(kind, text, file=str(p), name=p.stem)
        if not topology.hosts:
            raise ValueError(f"{path}: the topology has no hosts")
        return fabric_state(topology, version=None, origin=str(p))
    except OSError as e:
        raise ConfigError(f"invalid pool_allocator config: field `fabric_file`: {path}: {e.strerror}") from None
    except (FabricError, ValueError) as e:
        raise ConfigError(f"invalid pool_allocator config: field `fabric_file`: {e}") from None


def durable_name(prefix: str, source: str) -> str:
    """`<prefix>-fabric-<instance>`, with what a durable name cannot hold replaced by `_`."""
    instance = source.rpartition("/")[2] or "default"
    return re.sub(r"[^A-Za-z0-9_-]", "_", f"{prefix}-fabric-{instance}")


class FabricFeed:
    """Keeps `view` on the newest published topology (see the module docstring)."""

    def __init__(self, kit: Kit[PoolAllocatorConfig], view: FabricView) -> None:
        self.kit = kit
        self.view = view
        self.timeout_s = kit.config.fabric_fetch_timeout_s
        self._lock = asyncio.Lock()
        self._http: aiohttp.ClientSession | None = None
        self.failures = Counter(
            "ibpool_pool_fabric_fetch_failures",
            "Published topologies the allocator could not fetch or use",
            registry=kit.metrics.registry,
        )

    def subscription(self) -> Subscription:
        return Subscription(
            durable_name(self.kit.config.durable_prefix, self.kit.source),
            (TopologyPublished.subject_pattern(),),
            self.on_topology,
            transactional=False,
        )

    async def on_topology(self, event: TopologyPublished, _: HandlerContext | None = None) -> None:
        """Fetch and use the announced topology unless it is the one held or older; raises
        FabricFetchFailed (the previous fabric kept) when it cannot."""
        if not self.view.wants(event.version, event.content_hash):
            return
        if event.url is None:
            log.warning("topology published without a url; keeping the fabric held", version=event.version)
            return
        async with self._lock:
            if not self.view.wants(event.version, event.content_hash):
                return
            try:
                topology = await self._fetch(event.url)
                state = await asyncio.to_thread(_index, topology, event)
            except FabricFetchFailed as e:
                self.failures.inc()
                held = self.view.about
                log.warning(
                    "fabric topology not loaded; keeping the fabric held",
                    url=event.url,
                    version=event.version,
                    error=str(e),
                    held_version=held.version if held is not None else None,
                )
                raise
            self.view.replace(state)
        about = state.about
        log.info(
            "fabric topology loaded",
            version=about.version,
            hosts=about.hosts,
            leaf_groups=about.leaf_groups,
            url=event.url,
        )

    async def _fetch(self, url: str) -> Topology:
        if self._http is None:
            self._http = aiohttp.ClientSession()
        try:
            async with self._http.get(url, timeout=aiohttp.ClientTimeout(total=self.timeout_s)) as r:
                if r.status != 200:
                    raise FabricFetchFailed(f"GET {url}: HTTP {r.status}: {(await r.text())[:200]}")
                body = await r.read()
        except (aiohttp.ClientError, TimeoutError) as e:
            raise FabricFetchFailed(f"GET {url}: {type(e).__name__}: {e}") from None
        try:
            return msgspec.json.decode(body, type=Topology)
        except msgspec.DecodeError as e:
            raise FabricFetchFailed(f"GET {url}: not a topology: {e}") from None

    async def load_latest(self) -> None:
        """Use the newest TopologyPublished still in the stream, if any (logged, never raised)."""
        pattern = TopologyPublished.subject_pattern()
        newest = None
        try:
            sub = await self.kit.bus.js.pull_subscribe(
                pattern,
                stream=stream_for_subject(pattern),
                config=ConsumerConfig(
                    deliver_policy=DeliverPolicy.LAST_PER_SUBJECT, ack_policy=AckPolicy.NONE, inactive_threshold=5.0
                ),
            )
            try:
                pending = (await sub.consumer_info()).num_pending or 0
                while pending > 0:
                    batch = await sub.fetch(min(pending, 64), timeout=5)
                    pending -= len(batch)
                    for m in batch:
                        if newest is None or m.metadata.sequence.stream > newest.metadata.sequence.stream:
                            newest = m
            finally:
                await sub.unsubscribe()
        except Exception as e:  # no stream yet, bus hiccup: the subscription will bring the next one
            log.warning("could not read the last published topology", error=str(e) or type(e).__name__)
            return
        if newest is None:
            return
        try:
            event = decode(newest.data)
            if isinstance(event, TopologyPublished):
                await self.on_topology(event)
        except Exception as e:
            log.warning("last published topology not loaded", error=str(e) or type(e).__name__)

    async def run(self, stop: asyncio.Event) -> None:
        """Load the newest published topology, then hold the HTTP client until `stop`."""
        try:
            await self.load_latest()
            await stop.wait()
        finally:
            if self._http is not None:
                await self._http.close()
                self._http = None


def _index(topology: Topology, event: TopologyPublished) -> FabricState:
    digest = content_hash(topology)
    if digest != event.content_hash:
        raise FabricFetchFailed(
            f"GET {event.url}: content hash {digest[:12]} is not the announced {event.content_hash[:12]}"
        )
    try:
        return fabric_state(topology, version=event.version, origin=event.url or "", digest=digest)
    except (FabricError, ValueError, KeyError) as e:
        raise FabricFetchFailed(f"GET {event.url}: the topology cannot be indexed: {e}") from None
