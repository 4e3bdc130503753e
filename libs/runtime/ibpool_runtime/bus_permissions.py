"""Who may publish what on the bus: one NATS user per service, allowed only its own subjects.

Each service may publish the messages it owns (e.g. only the pool allocator publishes
`ibpool.pool.allocation.granted.*`), dead letters, acks, and the JetStream API calls that read
the streams it consumes; it subscribes only to its own reply inboxes (`_INBOX_<user>.>`, where
its pull consumers deliver and its requests are answered; `ibpool_runtime.bus.inbox_prefix`), so
no user reads the replies of another, and to the messages sent on core NATS only that it reads
live (`LIVE_READS`: heartbeats). No service user may delete a consumer, and none may create,
read, fetch from or ack on the durable consumers of another service (`SERVICE_DURABLES`).
Creating and changing streams is the admin's job (`ibpool_runtime.bus.Bus.ensure_streams` run
with the admin user); services find their streams in place. The exceptions are the buckets a
service owns: the leader-election KV bucket, made by whichever elector comes first, and the pool
ledger's snapshot object store, made by the pool allocator.

    python -m ibpool_runtime.bus_permissions PASSWORD_DIR [--agents AGENTS.json] > auth.conf

renders the nats-server `authorization` block from one password file per user in PASSWORD_DIR
(`<user>.password`, e.g. written by deploy/nats/make-auth.sh; never committed). AGENTS.json enrols
node agents each with a user of its own, allowed only its own nodes (`agent_permissions`).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from ibpool_proto import fabric, health, job, node, pool, scale, slurm
from ibpool_proto.message import Message

from .bus import inbox_prefix
from .discovery import ABOUT_PREFIX, about_subject
from .ledger_replica import LEDGER_BUCKET
from .streams import DLQ_SUBJECT_PREFIX, STREAMS

LEADER_BUCKET = "ibpool_leaders"

# The messages each service publishes: nobody else may.
PUBLISHES: dict[str, tuple[type[Message], ...]] = {
    "node_agent": (
        node.NodeRegistered,
        node.NodeDeregistered,
        node.NodeHeartbeat,
        node.TelemetryReported,
        node.HcaPortsReported,
        job.JobStarted,
        job.JobExited,
        job.JobStartedV2,
        job.JobExitedV2,
    ),
    "fabric_monitor": (
        fabric.TopologyPublished,
        fabric.LinkStateChanged,
        fabric.LinkDegraded,
        fabric.LinkFlapping,
        fabric.LinkRecovered,
    ),
    "pool_allocator": (
        pool.AllocationGranted,
        pool.AllocationRejected,
        pool.AllocationReleased,
        pool.AllocationRevoked,
        pool.AllocationExpired,
        pool.LeaseRenewed,
        pool.PoolNodeUpdated,
        pool.QuotaChanged,
    ),
    "failover_controller": (
        health.NodeSuspected,
        health.NodeFailed,
        health.NodeRecovered,
        health.GpuFailed,
        health.GpuRecovered,
        health.Cordoned,
        health.Uncordoned,
        health.DrainRequested,
        health.RequeueRequested,
        health.JobFlagged,
        health.ClusterDegraded,
        health.ClusterRestored,
    ),
    "scheduler": (
        job.JobQueued,
        job.JobScheduled,
        job.JobPreempted,
        job.JobRequeued,
        job.JobFinished,
        pool.ProposePlacement,
        pool.ProposePlacements,
        pool.ReplaceGangMember,
        pool.ReleaseAllocation,
        pool.RenewLease,
    ),
    "autoscaler": (scale.ScaleDecided, scale.ElasticJobResized, job.SubmitJob, job.CancelJob),
    # It acts on Slurm (scontrol) and tells what Slurm shows.
    "slurm_bridge": (slurm.SlurmNodeChanged,),
    # People and other systems acting on the cluster: submit work, ask for and give back GPUs, set quotas.
    "operator": (
        job.SubmitJob,
        job.CancelJob,
        pool.RequestAllocation,
        pool.ReleaseAllocation,
        pool.RenewLease,
        pool.SetQuota,
        # The load of an inference deployment, reported by whatever serves it (an ingress, a load generator).
        scale.DeploymentMetricsReported,
    ),
    # Other systems that only subscribe to ibpool's events.
    "subscriber": (),
    # The web dashboard (services/dashboard): reads, publishes nothing; its actions go through the
    # services' HTTP APIs with the operator's token.
    "dashboard": (),
}

# Every stream of events, which a reader of all of them (an outside subscriber, the dashboard) reads.
EVENT_STREAMS = (
    "IBPOOL_NODE",
    "IBPOOL_FABRIC",
    "IBPOOL_POOL",
    "IBPOOL_JOB",
    "IBPOOL_SCALE",
    "IBPOOL_HEALTH",
    "IBPOOL_SLURM",
)

# The streams each service reads with its consumers.
CONSUMES: dict[str, tuple[str, ...]] = {
    "node_agent": ("IBPOOL_POOL",),
    "fabric_monitor": ("IBPOOL_NODE",),
    "pool_allocator": ("IBPOOL_POOL", "IBPOOL_NODE", "IBPOOL_HEALTH", "IBPOOL_FABRIC"),
    "failover_controller": ("IBPOOL_NODE", "IBPOOL_FABRIC", "IBPOOL_JOB", "IBPOOL_POOL"),
    "scheduler": ("IBPOOL_JOB", "IBPOOL_POOL", "IBPOOL_NODE", "IBPOOL_HEALTH", "IBPOOL_FABRIC"),
    "autoscaler": ("IBPOOL_JOB", "IBPOOL_POOL", "IBPOOL_SCALE"),
    "slurm_bridge": ("IBPOOL_HEALTH", "IBPOOL_FABRIC"),
    "operator": (),
    "subscriber": EVENT_STREAMS,
    "dashboard": EVENT_STREAMS,
}

# The messages sent on core NATS only (`Message.stored` is False) each user reads live, by subscribing.
LIVE_READS: dict[str, tuple[type[Message], ...]] = {
    "failover_controller": (node.NodeHeartbeat,),
    "operator": (node.NodeHeartbeat,),
    "subscriber": (node.NodeHeartbeat,),
    "dashboard": (node.NodeHeartbeat,),
}

# Users that are not a service of the control plane: no dead letters, no service API to answer.
CLIENTS = ("operator", "subscriber")
# Users that list the services (`ibpool services`, the dashboard finding the APIs it reads).
LISTS_SERVICES = (*CLIENTS, "dashboard")

# Services that elect a leader over the NATS KV bucket.
ELECTS_LEADER = ("failover_controller", "scheduler", "autoscaler")

# The object store of the pool ledger's snapshots (ibpool_runtime.ledger_replica): the allocator
# writes it, the services keeping a ledger replica read it.
LEDGER_SNAPSHOT_WRITER = "pool_allocator"
LEDGER_SNAPSHOT_READERS = ("scheduler", "autoscaler")


class Permissions(dict[str, Any]):
    """nats-server's `permissions` object: {"publish": {"allow": [...], "deny": [...]}, "subscribe":
    {"allow": [...]}, "allow_responses": true}."""


# The durable consumers each service keeps, at its default `durable_prefix` (a test builds every
# service and checks this against the subscriptions it really makes): no other user may touch them.
# Not listed, as their names vary per deployment: each node agent's (`node-agent-<prefix>-...`) and
# each replica's fabric feed (`<prefix>-fabric-<instance>`, on IBPOOL_FABRIC).
SERVICE_DURABLES: dict[str, tuple[str, ...]] = {
    "pool_allocator": ("pool-allocator-commands", "pool-allocator-nodes", "pool-allocator-health"),
    "scheduler": ("scheduler-jobs", "scheduler-pool", "scheduler-health"),
    "failover_controller": (
        "failover-controller-nodes",
        "failover-controller-fabric",
        "failover-controller-jobs",
        "failover-controller-pool",
    ),
    "autoscaler": ("autoscaler-jobs", "autoscaler-metrics"),
    "fabric_monitor": ("fabric-monitor-fabric_monitor-hca",),
    "slurm_bridge": ("slurm-bridge-health",),
}


def _check_streams() -> list[str]:
    """Every service checks at start that all streams are in place as declared (reading their info only)."""
    return ["$JS.API.INFO", "$JS.API.STREAM.NAMES", *(f"$JS.API.STREAM.INFO.{s.name}" for s in STREAMS)]


def _read_durable(stream: str, durable: str) -> list[str]:
    """Consume `stream` through `durable` only: create it (also with its filter in the subject), look
    it up, fetch, ack, and dead-letter to its DLQ subject."""
    return [
        f"$JS.API.CONSUMER.CREATE.{stream}.{durable}",
        f"$JS.API.CONSUMER.CREATE.{stream}.{durable}.>",
        f"$JS.API.CONSUMER.DURABLE.CREATE.{stream}.{durable}",
        f"$JS.API.CONSUMER.INFO.{stream}.{durable}",
        f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{durable}",
        f"$JS.ACK.{stream}.{durable}.>",
        f"{DLQ_SUBJECT_PREFIX}.{durable}",
    ]


def _read_stream(stream: str) -> list[str]:
    """Consume `stream` with durables of one's own: create, look up, fetch, ack (never delete)."""
    return [
        f"$JS.API.CONSUMER.CREATE.{stream}.>",
        f"$JS.API.CONSUMER.DURABLE.CREATE.{stream}.>",
        f"$JS.API.CONSUMER.INFO.{stream}.>",
        f"$JS.API.CONSUMER.MSG.NEXT.{stream}.>",
        f"$JS.ACK.{stream}.>",
    ]


def _not_their_durables(user: str) -> list[str]:
    """The consumer API and ack subjects of every other service's durables (on any stream)."""
    out = []
    for owner, durables in sorted(SERVICE_DURABLES.items()):
        if owner == user:
            continue
        for d in durables:
            out += [
                f"$JS.API.CONSUMER.*.*.{d}",
                f"$JS.API.CONSUMER.*.*.{d}.>",
                f"$JS.API.CONSUMER.DURABLE.CREATE.*.{d}",
                f"$JS.API.CONSUMER.MSG.NEXT.*.{d}",
                f"$JS.ACK.*.{d}.>",
            ]
    return out


def permissions(user: str) -> Permissions:
    """What `user` (a service name, "dashboard", "operator" or "subscriber") may publish and subscribe to."""
    if user not in PUBLISHES:
        raise KeyError(f"no bus permissions for {user!r}; known: {', '.join(sorted(PUBLISHES))}")
    publish = sorted({m.subject_pattern() for m in PUBLISHES[user]}) + _check_streams()
    for stream in CONSUMES[user]:
        publish += _read_stream(stream)
    if user not in LISTS_SERVICES:  # a service with durable consumers: it may dead-letter
        publish.append(f"{DLQ_SUBJECT_PREFIX}.>")
    if user in ELECTS_LEADER:
        kv = f"KV_{LEADER_BUCKET}"
        publish += [
            f"$KV.{LEADER_BUCKET}.>",
            f"$JS.API.STREAM.CREATE.{kv}",
            f"$JS.API.DIRECT.GET.{kv}.>",
            f"$JS.API.STREAM.MSG.GET.{kv}",
            f"$JS.API.STREAM.INFO.{kv}",
            *_read_stream(kv),
        ]
    if user == LEDGER_SNAPSHOT_WRITER or user in LEDGER_SNAPSHOT_READERS:
        publish += _ledger_snapshots(write=user == LEDGER_SNAPSHOT_WRITER)
    subscribe = [f"{inbox_prefix(user)}.>", *(m.subject_pattern() for m in LIVE_READS.get(user, ()))]
    if user in LISTS_SERVICES:  # they may list the services (`ibpool services`)
        publish += ["$SRV.>", f"{ABOUT_PREFIX}.>"]
    if user in CLIENTS:
        return Permissions(
            publish={"allow": publish, "deny": _not_their_durables(user)}, subscribe={"allow": subscribe}
        )
    # A service answers the NATS service API and its `about` endpoint (ibpool_runtime.discovery):
    # it may reply to whoever asked, and to nothing else.
    subscribe += ["$SRV.>", about_subject(user)]
    return Permissions(
        publish={"allow": publish, "deny": _not_their_durables(user)},
        subscribe={"allow": subscribe},
        allow_responses=True,
    )


def _ledger_snapshots(write: bool) -> list[str]:
    """Reading the object store finds its stream, reads an object's meta (the last message of a
    subject) and its chunks (an ordered consumer, which answers flow control); writing also creates
    the store, puts chunks and meta and purges the chunks of the object it replaced."""
    stream = f"OBJ_{LEDGER_BUCKET}"
    allowed = [
        f"$JS.API.STREAM.INFO.{stream}",
        f"$JS.API.STREAM.MSG.GET.{stream}",
        f"$JS.API.DIRECT.GET.{stream}.>",
        f"$JS.FC.{stream}.>",
        f"$JS.API.CONSUMER.CREATE.{stream}",  # the ordered consumer is made without a name
        *_read_stream(stream),
    ]
    if write:
        allowed += [f"$O.{LEDGER_BUCKET}.>", f"$JS.API.STREAM.CREATE.{stream}", f"$JS.API.STREAM.PURGE.{stream}"]
    return allowed


class AgentGrant(NamedTuple):
    """What one node agent's own NATS user is for: the nodes it reports on and its durable of grants."""

    nodes: tuple[str, ...]
    durable: str


def agent_nodes(prefix: str, first: int, count: int) -> tuple[str, ...]:
    """The node ids of an agent hosting `count` nodes from `first` (the node agent names them so)."""
    return tuple(f"{prefix}-{i:03d}" for i in range(first, first + count))


def agent_durable(prefix: str, first: int, count: int) -> str:
    """The durable consumer of grants of such an agent."""
    return f"node-agent-{prefix}-{first}-{count}"


def agent_grant(prefix: str, first: int, count: int) -> AgentGrant:
    return AgentGrant(agent_nodes(prefix, first, count), agent_durable(prefix, first, count))


def agent_permissions(user: str, grant: AgentGrant) -> Permissions:
    """A node agent's own user: it publishes the node agents' messages keyed by node (all of them,
    JobStarted and JobExited since their v2) only on its own nodes' subjects, and the consumers refuse
    a message whose key is not the field it names (`ibpool_proto.misaddressed`), so it speaks only
    for its own nodes; it reads the pool stream only through its own durable, dead-letters only to
    that durable's DLQ subject, and reads only its own inboxes. The shared `node_agent` user, which
    speaks for every node, is for deployments that cannot enrol each agent (docs/security.md)."""
    keyed = [m for m in PUBLISHES["node_agent"] if m.key_name == "node_id"]
    publish = sorted({f"{m.subject_root()}.{node}" for m in keyed for node in grant.nodes})
    (stream,) = CONSUMES["node_agent"]
    publish += _check_streams() + _read_durable(stream, grant.durable)
    subscribe = [f"{inbox_prefix(user)}.>", "$SRV.>", about_subject("node_agent")]
    return Permissions(publish={"allow": publish}, subscribe={"allow": subscribe}, allow_responses=True)


# The user of nats-server's system account: it reads the servers' client connect/disconnect advisories
# (and may do everything else the system account may, so only the failover controller holds it).
SYSTEM_USER = "system"


def render_authorization(passwords: dict[str, str], agents: Mapping[str, AgentGrant] | None = None) -> str:
    """The nats-server `authorization` block: an `admin` user (everything) and one user per other
    entry, a node agent's own user (`agents`) allowed only its nodes; with a `system` entry, also the
    system account `SYS` with that one user."""
    agents = agents or {}
    if missing := sorted(set(agents) - set(passwords)):
        raise KeyError(f"no password for the agent users {', '.join(missing)}")
    users = []
    for user, password in sorted(passwords.items()):
        if user == SYSTEM_USER:
            continue
        entry: dict[str, object] = {"user": user, "password": password}
        if user in agents:
            entry["permissions"] = agent_permissions(user, agents[user])
        elif user != "admin":
            entry["permissions"] = permissions(user)
        users.append(entry)
    # nats-server's config format accepts JSON values.
    text = "authorization {\n  users: " + json.dumps(users, indent=2).replace("\n", "\n  ") + "\n}\n"
    if SYSTEM_USER in passwords:
        text += render_system_account(passwords[SYSTEM_USER])
    return text


def render_system_account(password: str) -> str:
    """nats-server's system account `SYS` with its one user, `system` (clients without a user, on an
    open server, stay in the global account)."""
    system = json.dumps([{"user": SYSTEM_USER, "password": password}])
    return f"accounts {{\n  SYS: {{ users: {system} }}\n}}\nsystem_account: SYS\n"


def read_agents(path: Path) -> dict[str, AgentGrant]:
    """An agents file: `{"<user>": {"nodes": ["node-001", ...], "durable": "node-agent-..."}, ...}`.
    Raises ValueError naming the file and the entry that is wrong."""
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: {e}") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected an object of agent users")
    out = {}
    for user, entry in raw.items():
        nodes, durable = (entry.get("nodes"), entry.get("durable")) if isinstance(entry, dict) else (None, None)
        if not (isinstance(nodes, list) and nodes and all(isinstance(n, str) and n for n in nodes)):
            raise ValueError(f"{path}: {user}: `nodes` must be a non-empty list of node ids")
        if not (isinstance(durable, str) and durable):
            raise ValueError(f"{path}: {user}: `durable` must be the agent's durable consumer name")
        out[str(user)] = AgentGrant(tuple(nodes), durable)
    return out


def main(argv: list[str]) -> int:
    usage = "usage: python -m ibpool_runtime.bus_permissions PASSWORD_DIR [--agents AGENTS.json]"
    if len(argv) not in (1, 3) or (len(argv) == 3 and argv[1] != "--agents"):
        print(usage, file=sys.stderr)
        return 2
    folder = Path(argv[0])
    try:
        agents = read_agents(Path(argv[2])) if len(argv) == 3 else {}
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    files = sorted(folder.glob("*.password"))
    if not files:
        print(f"no <user>.password files in {folder}", file=sys.stderr)
        return 2
    passwords = {f.stem: f.read_text().strip() for f in files}
    unknown = sorted(set(passwords) - set(PUBLISHES) - set(agents) - {"admin", SYSTEM_USER})
    if unknown:
        print(f"{folder}: no permissions known for {', '.join(unknown)}", file=sys.stderr)
        return 2
    if missing := sorted(set(agents) - set(passwords)):
        print(f"{folder}: no password for the agent users {', '.join(missing)}", file=sys.stderr)
        return 2
    sys.stdout.write(render_authorization(passwords, agents))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
