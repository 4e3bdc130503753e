"""What the Slurm bridge does to a Slurm cluster: `sync(SyncRequest) -> SyncReply`, data in and out.

The bridge keeps Slurm's node states in line with the failover controller's verdicts. Its input is
ibpool's cordons (`Cordoned` / `Uncordoned` events, folded by `apply_cordon`) and Slurm's own view
of its nodes, read back each round (`parse_scontrol_nodes` of `scontrol show node --details --oneliner`).
The reply is the `scontrol update` actions to take and the drains it will not make, as data.

Rules:

- A node drains in Slurm while it has an ibpool cordon of a scope the config drains for (node, and
  by default gpu, rail and leaf: a Slurm job asks for whole nodes and their fabric), with reason
  `ibpool: <scope>: <the cordon's reason>` (the first cordon, by scope then GPU/rail).
- Only drains ibpool made are resumed: a node whose Slurm reason starts with `ibpool:` and that has
  no such cordon any more. A node an operator drained (any other reason) is never touched, neither
  drained over nor resumed. So what ibpool applied is re-derived from Slurm itself: a restarted
  bridge neither drains twice nor forgets a drain it made.
- A node already drained or draining (any reason) is not drained again; a down node still gets its
  drain (Slurm keeps DRAIN through DOWN, and RESUME is what puts it back).
- Mass drains are refused: ibpool's drains (kept and new) may not pass
  `max(min_drains_allowed, floor(max_drain_fraction * nodes))`, the failover controller's
  split-brain rule; drains past it are refused, by node name, with the figures.
- Fabric host names map to Slurm node names through `names` (unmapped: the same name); a host Slurm
  does not know is refused, not guessed.

Pure and deterministic: actions and refusals come sorted by node name.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping
from typing import Literal

import msgspec

from ibpool_proto.slurm import SlurmNodeChanged

from .fabric.formats import Exported, export_topology
from .fabric.model import Topology, rename_hosts
from .ids import EventIds

__all__ = [
    "REASON_PREFIX",
    "BridgeConfig",
    "Cordon",
    "Drain",
    "Refused",
    "Resume",
    "SlurmNode",
    "SyncReply",
    "SyncRequest",
    "apply_cordon",
    "node_changes",
    "parse_node_names",
    "parse_scontrol_nodes",
    "slurm_topology",
    "sync",
    "wanted_drains",
]

REASON_PREFIX = "ibpool: "
Scope = Literal["node", "gpu", "rail", "leaf"]


class Cordon(msgspec.Struct, frozen=True, order=True, kw_only=True):
    """One ibpool cordon on a node, as the failover controller published it."""

    scope: Scope
    gpu_index: int = -1  # -1: not a GPU cordon
    rail: int = -1  # -1: not a rail cordon
    reason: str = ""


def apply_cordon(
    cordons: Mapping[str, tuple[Cordon, ...]], node: str, cordon: Cordon, *, lifted: bool
) -> dict[str, tuple[Cordon, ...]]:
    """`cordons` with `cordon` added (a Cordoned event) or removed (Uncordoned: same scope, GPU and
    rail, any reason). A node left with none is dropped."""
    same = (cordon.scope, cordon.gpu_index, cordon.rail)
    kept = tuple(c for c in cordons.get(node, ()) if (c.scope, c.gpu_index, c.rail) != same)
    mine = kept if lifted else tuple(sorted((*kept, cordon)))
    out = {n: cs for n, cs in cordons.items() if n != node}
    if mine:
        out[node] = mine
    return out


class BridgeConfig(msgspec.Struct, frozen=True, kw_only=True):
    # the cordon scopes that drain a Slurm node (gpu: a Slurm job that asked for the node's GPUs
    # would get the failed one; rail and leaf: its multi-node traffic crosses the broken link)
    drain_scopes: frozenset[Scope] = frozenset({"node", "gpu", "rail", "leaf"})
    max_drain_fraction: float = 0.2  # the failover controller's max_failed_fraction
    min_drains_allowed: int = 2


def wanted_drains(cordons: Mapping[str, tuple[Cordon, ...]], config: BridgeConfig) -> dict[str, str]:
    """Fabric node -> the Slurm reason it should be drained with, from its cordons."""
    out: dict[str, str] = {}
    for node, cs in cordons.items():
        draining = sorted((c for c in cs if c.scope in config.drain_scopes), key=_cordon_order)
        if draining:
            first = draining[0]
            what = {"gpu": f"gpu {first.gpu_index}", "rail": f"rail {first.rail}"}.get(first.scope, first.scope)
            out[node] = _one_line(
                f"{REASON_PREFIX}{what}: {first.reason}" if first.reason else f"{REASON_PREFIX}{what}"
            )
    return out


def _cordon_order(c: Cordon) -> tuple[int, int, int, str]:
    return (("node", "gpu", "rail", "leaf").index(c.scope), c.gpu_index, c.rail, c.reason)


def _one_line(text: str, limit: int = 200) -> str:
    """A reason scontrol takes: one line, no double quotes, bounded."""
    clean = " ".join(text.replace('"', "'").split())
    return clean if len(clean) <= limit else clean[: limit - 3] + "..."


class SlurmNode(msgspec.Struct, frozen=True, kw_only=True):
    """A Slurm node as `scontrol show node -d` shows it: its state flags (IDLE, DRAIN, DOWN, ...), its
    reason, and its GPUs (`Gres=`) with those Slurm jobs hold (`GresUsed=`), or the TRES counts
    (`CfgTRES`, `AllocTRES` gres/gpu) where accounting tracks GPUs."""

    name: str
    state: tuple[str, ...]
    reason: str = ""
    gpus: int = 0
    gpus_allocated: int = 0

    @property
    def drained(self) -> bool:
        """DRAIN set (drained or draining) or FAIL: Slurm places nothing new there."""
        return "DRAIN" in self.state or "FAIL" in self.state

    @property
    def ours(self) -> bool:
        return self.reason.startswith(REASON_PREFIX.rstrip())


def parse_scontrol_nodes(text: str) -> dict[str, SlurmNode]:
    """`scontrol show node --details --oneliner` -> node name -> SlurmNode. The reason is what follows
    `Reason=` up to Slurm's ` [user@time]` stamp (it may hold spaces); ValueError on a line without
    `NodeName=` or `State=`."""
    out: dict[str, SlurmNode] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        head, _, reason = line.partition(" Reason=")
        fields = dict(f.split("=", 1) for f in head.split() if "=" in f)
        if "NodeName" not in fields or "State" not in fields:
            raise ValueError(f"scontrol show node, line {number}: no NodeName= or State=: {line[:120]!r}")
        stamp = reason.rfind(" [")
        if stamp >= 0 and reason.rstrip().endswith("]"):
            reason = reason[:stamp]
        state = tuple(s for s in fields["State"].upper().replace("*", "").split("+") if s)
        out[fields["NodeName"]] = SlurmNode(
            name=fields["NodeName"],
            state=state,
            reason=reason.strip(),
            gpus=_gres_gpus(fields.get("Gres", "")) or _tres_gpus(fields.get("CfgTRES", "")),
            gpus_allocated=_gres_gpus(fields.get("GresUsed", "")) or _tres_gpus(fields.get("AllocTRES", "")),
        )
    return out


def _gres_gpus(gres: str) -> int:
    """The GPUs in a node's `Gres=` or `GresUsed=` (`scontrol show node -d`): `gpu:4`,
    `gpu:h100:8(S:0-1)`, `gpu:(null):3`, `gpu:a100:2(IDX:0,2),nic:1`; typed counts add up."""
    total = 0
    depth = 0
    item = ""
    for ch in gres + ",":
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            name, _, rest = item.partition(":")
            count = rest.split("(", 1)[0].rsplit(":", 1)[-1]
            if name == "gpu" and count.isdigit():
                total += int(count)
            item = ""
        else:
            item += ch
    return total


def _tres_gpus(tres: str) -> int:
    """The GPUs in a TRES list (`cpu=8,mem=1T,gres/gpu=8`): `gres/gpu`, or the sum of the typed
    `gres/gpu:<type>` counts where Slurm lists only those."""
    plain = 0
    typed = 0
    for item in tres.split(","):
        key, _, value = item.partition("=")
        if not value.isdigit():
            continue
        if key == "gres/gpu":
            plain = int(value)
        elif key.startswith("gres/gpu:"):
            typed += int(value)
    return plain or typed


class SyncRequest(msgspec.Struct, frozen=True, kw_only=True):
    wanted: dict[str, str]  # fabric node -> reason (`wanted_drains`)
    slurm: dict[str, SlurmNode]  # Slurm node name -> what Slurm shows now
    names: dict[str, str] = {}  # fabric host -> Slurm node name, where they differ
    config: BridgeConfig = BridgeConfig()


class Drain(msgspec.Struct, frozen=True, tag="drain", kw_only=True):
    node: str  # the Slurm node name
    reason: str

    def scontrol(self) -> list[str]:
        return ["update", f"NodeName={self.node}", "State=DRAIN", f"Reason={self.reason}"]


class Resume(msgspec.Struct, frozen=True, tag="resume", kw_only=True):
    node: str

    def scontrol(self) -> list[str]:
        return ["update", f"NodeName={self.node}", "State=RESUME"]


class Refused(msgspec.Struct, frozen=True, kw_only=True):
    node: str  # the fabric node
    why: str


class SyncReply(msgspec.Struct, frozen=True, kw_only=True):
    actions: list[Drain | Resume]
    refused: list[Refused]
    limit: int  # how many nodes ibpool may hold drained in Slurm at once


def sync(request: SyncRequest) -> SyncReply:
    """The scontrol actions that bring Slurm in line with `request.wanted` (see the module docstring)."""
    config, slurm = request.config, request.slurm
    limit = max(config.min_drains_allowed, math.floor(config.max_drain_fraction * len(slurm)))
    want: dict[str, tuple[str, str]] = {}  # Slurm name -> (fabric node, reason)
    refused: list[Refused] = []
    for node, reason in sorted(request.wanted.items()):
        name = request.names.get(node, node)
        if name not in slurm:
            refused.append(Refused(node=node, why=f"Slurm has no node {name!r}"))
        else:
            want[name] = (node, reason)
    actions: list[Drain | Resume] = []
    held = sorted(n for n, s in slurm.items() if s.drained and s.ours and n in want)
    new = sorted(n for n in want if not slurm[n].drained)
    room = max(0, limit - len(held))
    for name in new[:room]:
        actions.append(Drain(node=name, reason=want[name][1]))
    for name in new[room:]:
        refused.append(
            Refused(
                node=want[name][0],
                why=f"mass drain refused: ibpool may hold {limit} of {len(slurm)} Slurm nodes drained, "
                f"and {len(held) + room} are",
            )
        )
    for name, shown in sorted(slurm.items()):
        if shown.drained and shown.ours and name not in want:
            actions.append(Resume(node=name))
    actions.sort(key=lambda a: (a.node, isinstance(a, Resume)))
    refused.sort(key=lambda r: r.node)
    return SyncReply(actions=actions, refused=refused, limit=limit)


def parse_node_names(text: str, *, file: str) -> dict[str, str]:
    """A names file: `<fabric host> <slurm node>` per line, `#` comments. ValueError "FILE:LINE: why"
    on a line that is not two names, or a host or Slurm node named twice."""
    out: dict[str, str] = {}
    taken: dict[str, int] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 2:
            raise ValueError(f"{file}:{number}: expected '<fabric host> <slurm node>', got {raw.strip()!r}")
        host, node = parts
        if host in out:
            raise ValueError(f"{file}:{number}: fabric host {host} is named twice")
        if node in taken:
            raise ValueError(
                f"{file}:{number}: Slurm node {node} is already the name of another host (line {taken[node]})"
            )
        out[host], taken[node] = node, number
    return out


def slurm_topology(topology: Topology, fmt: str, names: Mapping[str, str]) -> Exported:
    """The Slurm topology file (`fmt`: slurm, slurm-block or slurm-yaml) of `topology`, its hosts under
    their Slurm names. FabricError when there is nothing to write (no named host cabled)."""
    renamed = rename_hosts(topology, {h: n for h, n in names.items() if h != n}) if names else topology
    return export_topology(fmt, renamed)


def node_changes(
    seen: Mapping[str, SlurmNode],
    shown: Mapping[str, SlurmNode],
    names: Mapping[str, str],
    *,
    source: str,
    now: dt.datetime,
) -> list[SlurmNodeChanged]:
    """A SlurmNodeChanged for each Slurm node whose state, reason or GPUs differ from what was `seen`
    (every node when nothing was), by Slurm name; `names` maps fabric hosts to Slurm names. A node
    whose host name cannot be a subject key (a `.` in it) is left out."""
    host_of = {slurm: host for host, slurm in names.items()}
    ids = EventIds(now)
    out: list[SlurmNodeChanged] = []
    for name, node in sorted(shown.items()):
        host = host_of.get(name, name)
        if seen.get(name) == node or not _subject_key(host):
            continue
        out.append(
            SlurmNodeChanged(
                id=ids.next(f"slurm/{name}"),
                occurred_at=now,
                source=source,
                key=host,
                node_id=host,
                slurm_node=name,
                state=list(node.state),
                reason=node.reason,
                drained_by_ibpool=node.drained and node.ours,
                gpus=node.gpus,
                gpus_allocated=node.gpus_allocated,
            )
        )
    return out


def _subject_key(host: str) -> bool:
    try:
        SlurmNodeChanged.subject(host)
    except ValueError:
        return False
    return True
