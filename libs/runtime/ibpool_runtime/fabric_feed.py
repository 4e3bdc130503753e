"""The fabric every placing service sees: the fabric monitor's published topology and its link health.

One component for the scheduler and the pool allocator (and any service that places): it keeps an
`ibpool_core.fabric.view.FabricView` on the newest published topology and the newest state of
every link, and answers where link health falls on the fabric (`link_health`).

Topologies. The fabric monitor announces each version with `TopologyPublished`, whose `url` serves
it (GET /v1/topology?version=N). On each announcement the feed fetches the topology (bounded by
`fetch_timeout_s`), checks its content hash against the announced one, indexes it in a worker
thread and swaps it into the view. A fetch that fails (unreachable, not 200, not a topology, a
content hash not the announced one, a topology that cannot be indexed) is logged with the URL and
the reason and counted (`ibpool_fabric_fetch_failures_total`); the last good fabric stays in
force, and the handler raises, so the message is retried with backoff and, after
`consumer_max_deliver` attempts, dead-lettered with the reason. An announcement of the topology
already held, or of an older version, is acknowledged without a fetch. `view.about` says which
version is in force (and where it came from).

Every replica needs the fabric, so the consumer is durable per instance
(`<prefix>-fabric-<instance>`), not shared. The view lives in memory: on start, `run` loads the
newest announcement still in the stream, so a restarted service does not wait for the next one.
A topology file (`load_fabric_file`) can stand in for clusters without a fabric monitor.

Links. `LinkStateChanged`, `LinkDegraded`, `LinkFlapping` and `LinkRecovered` are state: `run`
follows the newest of every link (`follow.follow_latest`) and keeps its newest state;
`links_version` moves with every change.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import re
from pathlib import Path
from typing import Any, Literal

import aiohttp
import msgspec
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from prometheus_client import Counter

from ibpool_core.fabric.formats import guess_format, import_topology
from ibpool_core.fabric.link_health import LinkState
from ibpool_core.fabric.model import FabricError, Topology, content_hash
from ibpool_core.fabric.view import FabricState, FabricView, fabric_state
from ibpool_proto.fabric import LinkDegraded, LinkFlapping, LinkRecovered, LinkStateChanged, TopologyPublished

from .bus import Rejected, decode_delivered
from .config import ConfigError
from .consumer import HandlerContext, Subscription
from .follow import follow_latest
from .logs import get_logger
from .outages import OUTAGES
from .service import Kit
from .streams import stream_for_subject

log = get_logger(__name__)

LINK_NEWS = (LinkStateChanged, LinkDegraded, LinkFlapping, LinkRecovered)
# A topology file's format in a service's config (`fabric_format`): "auto" guesses it
# (`ibpool_core.fabric.formats.guess_format`), the others are `IMPORT_FORMATS`.
FabricFormat = Literal["auto", "native", "ibnetdiscover", "slurm", "slurm-block", "k8s-labels", "volcano"]


class FabricFetchFailed(Exception):
    """A published topology could not be fetched or used; the message says which URL and why."""


def load_fabric_file(path: str, fmt: str = "auto", *, service: str, field: str = "fabric_file") -> FabricState:
    """The fabric of a topology file in any format `ibpool topo convert` reads (`fmt` "auto": guessed
    from its content and name); ConfigError naming the service's config field, the file and what is wrong."""
    p = Path(path)
    try:
        text = p.read_text()
        kind = guess_format(str(p), text) if fmt == "auto" else fmt
        topology = import_topology(kind, text, file=str(p), name=p.stem)
        if not topology.hosts:
            raise ValueError(f"{path}: the topology has no hosts")
        return fabric_state(topology, version=None, origin=str(p))
    except OSError as e:
        raise ConfigError(f"invalid {service} config: field `{field}`: {path}: {e.strerror}") from None
    except (FabricError, ValueError) as e:
        raise ConfigError(f"invalid {service} config: field `{field}`: {e}") from None


def durable_name(prefix: str, source: str) -> str:
    """`<prefix>-fabric-<instance>`, with what a durable name cannot hold replaced by `_`."""
    instance = source.rpartition("/")[2] or "default"
    return re.sub(r"[^A-Za-z0-9_-]", "_", f"{prefix}-fabric-{instance}")


def link_state_of(message: object) -> tuple[str, dt.datetime, LinkState] | None:
    """(link id, when, its state) of a link verdict; None for any other message."""
    match message:
        case LinkStateChanged():
            return message.link_id, message.occurred_at, message.state
        case LinkDegraded():
            return message.link_id, message.occurred_at, "degraded"
        case LinkFlapping():
            return message.link_id, message.occurred_at, "flapping"
        case LinkRecovered():
            return message.link_id, message.occurred_at, "up"
    return None


class FabricFeed:
    """Keeps `view` on the newest published topology and `links` on the newest verdict of every link
    (see the module docstring). `durable_prefix` names its durable consumer; `follow_links` off: the
    link verdicts are not followed (a service that reads them otherwise)."""

    def __init__(
        self,
        kit: Kit[Any],
        view: FabricView,
        *,
        fetch_timeout_s: float,
        durable_prefix: str,
        follow_links: bool = True,
    ) -> None:
        self.kit = kit
        self.view = view
        self.timeout_s = fetch_timeout_s
        self.durable_prefix = durable_prefix
        self.follow_links = follow_links
        # link id -> (when, its newest state)
        self.links: dict[str, tuple[dt.datetime, LinkState]] = {}
        # Moves with every change of `links` (and of the fabric they fall on), so a reader rebuilds only then.
        self.links_version = 0
        self._health: tuple[object, int, dict[str, LinkState]] | None = None
        self._lock = asyncio.Lock()
        self._http: aiohttp.ClientSession | None = None
        self.failures = Counter(
            "ibpool_fabric_fetch_failures",
            "Published topologies this service could not fetch or use (the last good one stays in force)",
            registry=kit.metrics.registry,
        )

    def subscription(self) -> Subscription:
        return Subscription(
            durable_name(self.durable_prefix, self.kit.source),
            (TopologyPublished.subject_pattern(),),
            self.on_topology,
            transactional=False,
        )

    # -- links -------------------------------------------------------------------------------------

    def on_link(self, message: object) -> None:
        """Keep the newest state of the link a verdict names (older verdicts change nothing)."""
        found = link_state_of(message)
        if found is None:
            return
        link_id, at, state = found
        old = self.links.get(link_id)
        if old is None or at >= old[0]:
            self.links[link_id] = (at, state)
            if old is None or old[1] != state:
                self.links_version += 1

    def link_health(self) -> dict[str, LinkState]:
        """Where the links not "up" fall on the fabric in force (`FabricState.link_health`): host name
        or leaf GUID -> worst state; empty while no fabric is known. Recomputed only when the fabric
        or a link changed."""
        state = self.view.state
        if state is None:
            return {}
        hit = self._health
        if hit is not None and hit[0] is state and hit[1] == self.links_version:
            return hit[2]
        health = state.link_health({link_id: st for link_id, (_, st) in self.links.items()})
        self._health = (state, self.links_version, health)
        return health

    # -- topologies --------------------------------------------------------------------------------

    async def on_topology(self, event: TopologyPublished, _: HandlerContext | None = None) -> None:
        """Fetch and use the announced topology unless it is the one held or older; raises
        FabricFetchFailed (the previous fabric kept) when it cannot."""
        if not self.view.wants(event.version, event.content_hash, event.key):
            return
        if event.url is None:
            log.warning("topology published without a url; keeping the fabric held", version=event.version)
            return
        async with self._lock:
            if not self.view.wants(event.version, event.content_hash, event.key):
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
            self.links_version += 1
        about = state.about
        log.info(
            "fabric topology loaded",
            version=about.version,
            hosts=about.hosts,
            leaf_groups=about.leaf_groups,
            levels=about.levels,
            sharp_switches=about.sharp_switches,
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
        except OUTAGES as e:  # no stream yet, bus hiccup: the subscription will bring the next one
            self.kit.metrics.loop_failed("fabric topology load", e)
            log.warning("could not read the last published topology", error=str(e) or type(e).__name__)
            return
        if newest is None:
            return
        try:
            event = decode_delivered(newest)
            if isinstance(event, Rejected):
                log.warning("last published topology not loaded", why=event.why, error=event.error)
            elif isinstance(event, TopologyPublished):
                await self.on_topology(event)
        except FabricFetchFailed as e:  # already counted (`ibpool_fabric_fetch_failures`) and logged with the URL
            log.warning("last published topology not loaded", error=str(e) or type(e).__name__)

    async def run(self, stop: asyncio.Event) -> None:
        """Load the newest published topology, follow the link verdicts, hold the HTTP client until `stop`."""
        try:
            await self.load_latest()
            if self.follow_links:
                bus = self.kit.bus
                await asyncio.gather(
                    *(
                        follow_latest(bus, t.subject_pattern(), stop, self.on_link, metrics=self.kit.metrics)
                        for t in LINK_NEWS
                    ),
                    stop.wait(),
                )
            else:
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
