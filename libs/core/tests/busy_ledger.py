"""A busy pool ledger, built through the allocator's own decisions, for snapshot sizes and timings.

`busy_ledger(nodes)` registers `nodes` nodes of 8 H100s and fills the cluster the way a running
system would: every change is a command decided by `allocate.decide` on the ledger as it stands
and folded in with `ledger.apply` (what the pool allocator does, without its store and bus), and
the events come back in order, so they can be published on the pool stream and replayed.

The mix, drawn with a seeded RNG so every call with the same arguments gives the same ledger:

- 4 tenants with a quota each (SetQuota), one queue per tenant;
- the past an allocator keeps (`PAST_KEPT` = 10,000 answers and end events of allocations no
  longer held): `past` short jobs (whole GPUs of one node, every 20th a 2-node gang) granted and
  released before the fill, and `past // 2` lease renewals of held allocations after it, so the
  answers of the past sit mid-way in their sawtooth (10,000..20,000, see `_forget_the_past`) and
  the end events at its foot (10,000);
- the fill, share by share of the nodes: 50 % in multi-node gangs on consecutive nodes (8 whole
  GPUs per node; 2 to 256 nodes, small ones most often, the last one cut to what the share has
  left), 30 % shared by single-node jobs of 1, 2, 4 or 8 whole GPUs (one in ten left free), 8 %
  holding fractions (250 or 500 milli, two or three per GPU), 2 % holding MIG instances (two to
  seven per GPU), 10 % idle.

Everything is a ProposePlacement on the current version (what the scheduler sends), with host CPU
and memory per GPU, a lease of an hour and a small workload, so the granted events carry what
real ones do. Used by tests/bench/bench_snapshot.py and libs/core/tests/test_snapshot_size.py.
"""

from __future__ import annotations

import datetime as dt
import random
from collections import Counter
from typing import NamedTuple

import msgspec

from ibpool_core.pool import allocate as al
from ibpool_core.pool import mig
from ibpool_core.pool.ledger import PAST_KEPT, Ledger, apply
from ibpool_core.pool.messages import LedgerEvent, ProposePlacement, SetQuota
from ibpool_core.pool.quotas import Quota
from ibpool_proto.node import GpuInfo, NodeRegistered
from ibpool_proto.pool import GpuAssignment, ReleaseAllocation, RenewLease, WorkloadSpec

T0 = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)
MODEL = "NVIDIA H100 80GB HBM3"
GPU_MIB = 81_559
GPUS_PER_NODE = 8
TENANTS = ("research", "prod", "batch", "inference")
LEASE_S = 3600.0
# Host CPU and memory a job asks per GPU it holds on a node.
CPU_PER_GPU = 16_000
HOST_MIB_PER_GPU = 100_000
GANG_SIZES = (2, 4, 8, 16, 32, 64, 128, 256)
GANG_WEIGHTS = (30, 25, 20, 12, 7, 3, 2, 1)
MIG_LAYOUTS = (("3g.40gb", "3g.40gb"), ("2g.20gb", "2g.20gb", "2g.20gb"), ("1g.10gb",) * 7, ("4g.40gb", "2g.20gb"))
FRACTION_LAYOUTS = ((500, 500), (500, 250, 250), (250, 250), (500, 250))


class Busy(NamedTuple):
    ledger: Ledger
    events: list[LedgerEvent]  # every event the decisions made, in order: replayed, they give `ledger`
    kinds: dict[str, int]  # allocations held, by kind
    gpus_held: int  # GPUs with any share held


def node_id(i: int) -> str:
    return f"node-{i:05d}"


def _registered(i: int) -> NodeRegistered:
    nid = node_id(i)
    return NodeRegistered(
        source="node_agent",
        key=nid,
        node_id=nid,
        hostname=f"{nid}.cluster.example",
        cpu_milli=224_000,
        memory_mib=2_000_000,
        backend="nvml",
        labels={"ibpool.io/gpu-model": MODEL},
        api_url=f"http://{nid}.cluster.example:9400",
        gpus=[
            GpuInfo(
                index=g,
                uuid=f"GPU-{i:05d}{g:03d}-8c1e-4b6f-9d3a-{i * 8 + g:012x}",
                model=MODEL,
                memory_mib=GPU_MIB,
                mig_capable=True,
                nvlink_domain=f"{nid}.cluster.example",
            )
            for g in range(GPUS_PER_NODE)
        ],
    )


def _quota(tenant: str, nodes: int) -> SetQuota:
    gpus = nodes * GPUS_PER_NODE
    q = msgspec.convert(
        {
            "scope": "tenant",
            "name": tenant,
            "gpu_model": MODEL,
            "nominal": {"milli": gpus * 1000, "memory_mib": gpus * GPU_MIB},
        },
        Quota,
    )
    return SetQuota(id=f"quota-{tenant}", source="api", key=tenant, quota=q)


class _Builder:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.ledger = Ledger()
        self.events: list[LedgerEvent] = []
        self.now = T0
        self.jobs = 0

    def decide(self, command: al.Input) -> al.Decision:
        self.now += dt.timedelta(milliseconds=5)
        decision = al.decide(self.ledger, command, self.now)
        apply(self.ledger, decision.events)
        self.events.extend(decision.events)
        return decision

    def propose(self, assignments: list[GpuAssignment], milli_per_node: int) -> str:
        """A scheduler's proposal of `assignments` on the current version, with host CPU and memory for
        `milli_per_node` of GPU on each node; its allocation id."""
        self.jobs += 1
        tenant = TENANTS[self.jobs % len(TENANTS)]
        job = f"{tenant}-job-{self.jobs:07d}"
        cmd = ProposePlacement(
            id=f"prop-{job}-0",
            source="scheduler",
            key=job,
            job_id=job,
            tenant=tenant,
            queue=f"{tenant}-default",
            ledger_version=self.ledger.version,
            assignments=assignments,
            lease_s=LEASE_S,
            workload=WorkloadSpec(command=["python", "-m", "train", "--config", f"/jobs/{job}/config.yaml"]),
            cpu_milli=CPU_PER_GPU * milli_per_node // 1000,
            host_memory_mib=HOST_MIB_PER_GPU * milli_per_node // 1000,
            scheduler_group="default",
            fencing_term=1,
        )
        decision = self.decide(cmd)
        if not decision.granted:
            raise AssertionError(f"the busy ledger's proposal {cmd.id} was not granted: {decision}")
        return cmd.id

    def whole(self, nodes: list[str], gpus: list[int]) -> str:
        return self.propose([GpuAssignment(node_id=n, gpu_index=g) for n in nodes for g in gpus], 1000 * len(gpus))

    def gang(self, left: list[str]) -> int:
        """A gang of 8 whole GPUs on each of the first nodes of `left` (one node: a whole-node job);
        how many nodes it took."""
        size = min(self.rng.choices(GANG_SIZES, GANG_WEIGHTS)[0], len(left))
        self.whole(left[:size], list(range(GPUS_PER_NODE)))
        return size

    def single_node_jobs(self, left: list[str]) -> int:
        nid = left[0]
        free = list(range(GPUS_PER_NODE))
        while free:
            size = min(self.rng.choice((1, 2, 4, 8)), len(free))
            take, free = free[:size], free[size:]
            if self.rng.random() >= 0.1:
                self.whole([nid], take)
        return 1

    def fractions(self, left: list[str]) -> int:
        nid = left[0]
        for g in range(GPUS_PER_NODE):
            for milli in self.rng.choice(FRACTION_LAYOUTS):
                self.propose([GpuAssignment(node_id=nid, gpu_index=g, milli=milli)], milli)
        return 1

    def mig_instances(self, left: list[str]) -> int:
        nid = left[0]
        for g in range(GPUS_PER_NODE):
            for profile in self.rng.choice(MIG_LAYOUTS):
                self.propose(
                    [GpuAssignment(node_id=nid, gpu_index=g, mig_profile=profile)], mig.profile_of(MODEL, profile).milli
                )
        return 1


def busy_ledger(nodes: int, *, seed: int = 0, past: int = PAST_KEPT) -> Busy:
    """A ledger of `nodes` nodes of 8 GPUs, most of them held (see the module docstring), and the
    events that built it."""
    b = _Builder(seed)
    for tenant in TENANTS:
        b.decide(_quota(tenant, nodes))
    ids = [node_id(i) for i in range(1, nodes + 1)]
    for i in range(1, nodes + 1):
        b.decide(_registered(i))
    # The past: short jobs that came and went (their answers and end events stay, up to PAST_KEPT).
    for k in range(past):
        first = ids[k % nodes]
        members = [first, ids[(k + 1) % nodes]] if k % 20 == 19 and nodes > 1 else [first]
        gpus = list(range(GPUS_PER_NODE if len(members) > 1 else b.rng.choice((1, 2, 4, 8))))
        done = b.whole(members, gpus)
        b.decide(ReleaseAllocation(source="scheduler", key=done, allocation_id=done, reason="job finished"))
    # The fill: each share of the nodes in turn; a gang takes consecutive nodes (the scheduler keeps
    # a gang under few leaves), never more than its share has left.
    at = 0
    for share, fill in ((0.5, b.gang), (0.3, b.single_node_jobs), (0.08, b.fractions), (0.02, b.mig_instances)):
        end = min(nodes, at + round(share * nodes))
        while at < end:
            at += fill(ids[at:end])
    # Lease renewals of held allocations (each answer is kept among the past's).
    held = sorted(b.ledger.allocations.values(), key=lambda a: a.allocation_id)
    for k in range(past // 2 if held else 0):
        alloc = held[k % len(held)]
        b.decide(
            RenewLease(
                id=f"renew-{alloc.allocation_id}-{k // len(held)}",
                source="scheduler",
                key=alloc.allocation_id,
                allocation_id=alloc.allocation_id,
                holder=alloc.job_id,
                extend_s=LEASE_S,
            )
        )
    kinds = Counter(a.kind for a in b.ledger.allocations.values())
    held_gpus = sum(1 for n in b.ledger.nodes.values() for g in n.gpus if g.holders)
    return Busy(b.ledger, b.events, dict(sorted(kinds.items())), held_gpus)
