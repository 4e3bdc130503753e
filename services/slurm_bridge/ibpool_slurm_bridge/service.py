"""The Slurm bridge: ibpool's cordons become Slurm drains, ibpool's fabric becomes Slurm's topology file.

- Cordons: `Cordoned` / `Uncordoned` from the failover controller are kept in the store (the newest
  word on each; handler: lock -> record -> commit), and each change wakes a round.
- A round (`sync_round`, at once after a change and every `sync_interval_s`): read the cordons, read
  Slurm's nodes (`scontrol show node --details --oneliner`), publish a SlurmNodeChanged for each node Slurm
  shows differently from the last round (every node after a start), decide
  (`ibpool_core.slurm_bridge.sync`), carry out at most `max_actions_per_round` scontrol updates.
  What ibpool drained is read back from Slurm itself (the reason starts with `ibpool:`), so a
  restart neither drains twice nor forgets its drains.
- Topology: the fabric feed keeps the newest published topology; when its content is not the one
  written, the topology file is rendered (`slurm_topology`), written atomically only if its text
  changed (the file before it kept as `<file>.previous`), and `scontrol reconfigure` run; when Slurm
  then does not show the file's switches, the previous file is put back and Slurm reconfigured again.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import os
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path

import msgspec
from prometheus_client import Counter, Gauge

from ibpool_core.fabric.model import FabricError
from ibpool_core.fabric.view import FabricView
from ibpool_core.slurm_bridge import (
    BridgeConfig,
    Cordon,
    Drain,
    Refused,
    SlurmNode,
    SyncRequest,
    node_changes,
    parse_node_names,
    slurm_topology,
    sync,
    wanted_drains,
)
from ibpool_proto.health import Cordoned, Uncordoned
from ibpool_runtime.config import ConfigError
from ibpool_runtime.consumer import HandlerContext, Subscription
from ibpool_runtime.fabric_feed import FabricFeed
from ibpool_runtime.logs import get_logger
from ibpool_runtime.outages import OUTAGES
from ibpool_runtime.service import Kit

from . import state
from .config import SlurmBridgeConfig
from .slurm import Scontrol, ScontrolFailed

log = get_logger(__name__)

SCOPES = ("node", "gpu", "rail", "leaf")


class RoundView(msgspec.Struct, frozen=True, kw_only=True):
    """What the last round saw and did (the API's answer)."""

    at: dt.datetime
    wanted: dict[str, str]  # fabric node -> the reason ibpool drains it with
    drained: list[str]  # Slurm nodes drained by ibpool's rounds this time
    resumed: list[str]
    refused: list[Refused]
    limit: int
    slurm_nodes: int
    error: str = ""  # why the round could not finish (Slurm unreachable ...)


class TopologyView(msgspec.Struct, frozen=True, kw_only=True):
    file: str
    content_hash: str = ""  # of the fabric written (the file's text changes only with what Slurm sees)
    version: int | None = None
    written_at: dt.datetime | None = None
    error: str = ""


def bridge_config(cfg: SlurmBridgeConfig) -> BridgeConfig:
    scopes = tuple(s.strip() for s in cfg.drain_scopes.split(",") if s.strip())
    bad = [s for s in scopes if s not in SCOPES]
    if bad:
        raise ConfigError(f"drain_scopes: {', '.join(bad)} not among {', '.join(SCOPES)}")
    return BridgeConfig(
        drain_scopes=frozenset(scopes),  # type: ignore[arg-type]  # checked just above
        max_drain_fraction=cfg.max_drain_fraction,
        min_drains_allowed=cfg.min_drains_allowed,
    )


def read_names(cfg: SlurmBridgeConfig) -> dict[str, str]:
    if not cfg.names_file:
        return {}
    try:
        return parse_node_names(Path(cfg.names_file).read_text(), file=cfg.names_file)
    except OSError as e:
        raise ConfigError(f"names_file: cannot read {cfg.names_file}: {e}") from None
    except ValueError as e:
        raise ConfigError(f"names_file: {e}") from None


def write_if_changed(path: Path, text: str) -> bool:
    """Write `text` to `path` atomically (a temporary file renamed over it), keeping the file it
    replaces as `<path>.previous`; False (nothing written) when `path` holds `text` already."""
    try:
        if path.read_text() == text:
            return False
    except FileNotFoundError:
        pass
    tmp = path.with_name(f".{path.name}.ibpool-new")
    with tmp.open("w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    if path.exists():
        shutil.copy2(path, path.with_name(path.name + ".previous"))
    os.replace(tmp, path)
    return True


def switch_names(text: str) -> set[str]:
    """The switch (or block) names of a topology.conf or of `scontrol show topology`."""
    out = set()
    for token in text.split():
        key, _, value = token.partition("=")
        if key.lower() in ("switchname", "blockname") and value:
            out.add(value)
    return out


class SlurmBridge:
    def __init__(self, kit: Kit[SlurmBridgeConfig], scontrol: Scontrol | None = None) -> None:
        self.kit = kit
        self.cfg = kit.config
        self.bridge = bridge_config(self.cfg)
        self.names = read_names(self.cfg)
        self.scontrol = scontrol or Scontrol(self.cfg)
        self.feed = FabricFeed(
            kit,
            FabricView(),
            fetch_timeout_s=self.cfg.fetch_timeout_s,
            durable_prefix=self.cfg.durable_prefix,
            follow_links=False,
        )
        self.wake = asyncio.Event()
        self.last: RoundView | None = None
        # Slurm's nodes as the last round read them (what SlurmNodeChanged compares with).
        self.seen: dict[str, SlurmNode] = {}
        self.topology = TopologyView(file=self.cfg.topology_file)
        registry = kit.metrics.registry
        self.actions = Counter(
            "ibpool_slurm_bridge_actions",
            "scontrol updates made, by kind (drain, resume)",
            ["action"],
            registry=registry,
        )
        self.refusals = Counter(
            "ibpool_slurm_bridge_refusals",
            "Drains refused, per round and node (mass drain past the limit, a node Slurm does not know)",
            ["why"],
            registry=registry,
        )
        self.failures = Counter(
            "ibpool_slurm_bridge_scontrol_failures",
            "Rounds or topology updates that scontrol failed (Slurm unreachable, a refusal)",
            registry=registry,
        )
        self.topology_writes = Counter(
            "ibpool_slurm_bridge_topology_writes",
            "Topology files written, by outcome (taken, rolled_back)",
            ["outcome"],
            registry=registry,
        )
        self.held = Gauge(
            "ibpool_slurm_bridge_wanted_drains", "Nodes ibpool's cordons want drained in Slurm", registry=registry
        )

    def subscriptions(self) -> list[Subscription]:
        return [
            Subscription(
                f"{self.cfg.durable_prefix}-health",
                (Cordoned.subject_pattern(), Uncordoned.subject_pattern()),
                self.on_cordon,
            ),
            dataclasses.replace(self.feed.subscription(), handler=self.on_topology),
        ]

    # -- handlers ------------------------------------------------------------------------------------

    async def on_cordon(self, event: Cordoned | Uncordoned, ctx: HandlerContext) -> None:
        """Keep the newest word on the cordon; a change wakes a round once it is committed."""
        assert ctx.tx is not None
        cordon = Cordon(
            scope=event.scope,
            gpu_index=-1 if event.gpu_index is None else event.gpu_index,
            rail=-1 if event.rail is None else event.rail,
            reason=event.reason,
        )
        lifted = isinstance(event, Uncordoned)
        if await state.record_cordon(ctx.tx.conn, event.node_id, cordon, lifted=lifted, at=event.occurred_at):
            ctx.tx.after_commit(self.wake.set)

    async def on_topology(self, event: object, ctx: HandlerContext | None = None) -> None:
        await self.feed.on_topology(event, ctx)  # type: ignore[arg-type]  # the feed's subscription decodes it
        self.wake.set()

    # -- rounds --------------------------------------------------------------------------------------

    async def sync_round(self) -> RoundView:
        """Read the cordons and Slurm's nodes, decide, carry out the actions (see the module docstring)."""
        now = dt.datetime.now(dt.UTC)
        cordons = await state.cordons(self.kit.store.pool)
        wanted = wanted_drains(cordons, self.bridge)
        self.held.set(len(wanted))
        try:
            nodes = await self.scontrol.nodes()
        except ScontrolFailed as e:
            self.failures.inc()
            log.warning("Slurm's nodes could not be read; nothing drained or resumed this round", error=str(e))
            return RoundView(
                at=now, wanted=wanted, drained=[], resumed=[], refused=[], limit=0, slurm_nodes=0, error=str(e)
            )
        await self.publish_changes(nodes, now)
        reply = sync(SyncRequest(wanted=wanted, slurm=nodes, names=self.names, config=self.bridge))
        drained: list[str] = []
        resumed: list[str] = []
        error = ""
        for action in reply.actions[: self.cfg.max_actions_per_round]:
            try:
                await self.scontrol.run(*action.scontrol())
            except ScontrolFailed as e:
                self.failures.inc()
                error = str(e)
                log.warning("scontrol update failed", node=action.node, error=error)
                continue
            kind = "drain" if isinstance(action, Drain) else "resume"
            self.actions.labels(kind).inc()
            (drained if kind == "drain" else resumed).append(action.node)
            log.info("Slurm node updated", node=action.node, action=kind, reason=getattr(action, "reason", ""))
        for r in reply.refused:
            self.refusals.labels("mass drain" if r.why.startswith("mass drain") else "unknown node").inc()
        if reply.refused:
            log.warning("drains refused", refused={r.node: r.why for r in reply.refused})
        return RoundView(
            at=now,
            wanted=wanted,
            drained=drained,
            resumed=resumed,
            refused=reply.refused,
            limit=reply.limit,
            slurm_nodes=len(nodes),
            error=error,
        )

    async def publish_changes(self, nodes: dict[str, SlurmNode], now: dt.datetime) -> None:
        """SlurmNodeChanged for each node Slurm shows differently from the last round (all of them
        after a start), through the outbox."""
        events = node_changes(self.seen, nodes, self.names, source=self.kit.source, now=now)
        if events:
            async with self.kit.store.transaction() as tx:
                await tx.outbox(*events)
        self.seen = nodes

    async def update_topology(self) -> None:
        """Write the topology file of the fabric in force when it is not the one written (module docstring)."""
        fabric = self.feed.view.state
        if not self.cfg.topology_file or fabric is None or fabric.about.content_hash == self.topology.content_hash:
            return
        about = fabric.about
        path = Path(self.cfg.topology_file)
        try:
            exported = slurm_topology(fabric.index.topology, self.cfg.topology_format, self.names)
        except FabricError as e:
            self.topology = msgspec.structs.replace(self.topology, content_hash=about.content_hash, error=str(e))
            log.warning("no topology file for this fabric", version=about.version, error=str(e))
            return
        for w in exported.warnings:
            log.warning("topology export", version=about.version, warning=w)
        written = await asyncio.to_thread(write_if_changed, path, exported.text)
        error = ""
        if written and self.cfg.reconfigure:
            error = await self._reconfigure(path, exported.text)
        self.topology = TopologyView(
            file=str(path),
            content_hash=about.content_hash,
            version=about.version,
            written_at=dt.datetime.now(dt.UTC) if written else self.topology.written_at,
            error=error,
        )
        log.info("topology file", file=str(path), version=about.version, written=written, error=error or None)

    async def _reconfigure(self, path: Path, text: str) -> str:
        """`scontrol reconfigure`, then Slurm must show the file's switches; else the previous file
        goes back (and Slurm is reconfigured on it). The error, or ""."""
        try:
            await self.scontrol.run("reconfigure")
            if self.cfg.topology_format != "slurm":
                self.topology_writes.labels("taken").inc()
                return ""  # block and yaml: Slurm 22.05's scontrol shows no blocks to compare
            shown = switch_names(await self.scontrol.run("show", "topology"))
            missing = switch_names(text) - shown
            if not missing:
                self.topology_writes.labels("taken").inc()
                return ""
            error = f"Slurm does not show {len(missing)} switch(es) of the new file, e.g. {sorted(missing)[0]}"
        except ScontrolFailed as e:
            error = str(e)
        self.failures.inc()
        self.topology_writes.labels("rolled_back").inc()
        previous = path.with_name(path.name + ".previous")
        log.error("Slurm did not take the new topology file; the previous one is put back", error=error)
        if previous.exists():
            os.replace(previous, path)
            with contextlib.suppress(ScontrolFailed):
                await self.scontrol.run("reconfigure")
        return error

    async def sync_loop(self, stop: asyncio.Event) -> None:
        """A round at once after a change (a cordon, a topology) and every `sync_interval_s`."""
        await self._each(stop, self._round)

    async def _round(self) -> None:
        await self.update_topology()
        self.last = await self.sync_round()

    async def _each(self, stop: asyncio.Event, step: Callable[[], Awaitable[None]]) -> None:
        while not stop.is_set():
            self.wake.clear()
            try:
                await step()
            except OUTAGES as e:  # the store away for a moment: the next round tries again
                self.kit.metrics.loop_failed("slurm bridge round", e)
                log.warning("round failed", error=str(e) or type(e).__name__)
            waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(self.wake.wait())]
            try:
                await asyncio.wait(waits, timeout=self.cfg.sync_interval_s, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()
