"""The ledger against a plain reference model, over random interleavings of proposals, requests,
releases, renewals, expiries, node and GPU failures, cordons, re-registrations, quota changes and
repeated commands.

The reference keeps only the list of live allocations and the nodes' states; usage is summed from
the allocations every time, and what should be granted is worked out from scratch (by brute force
for requests), not from the ledger's bookkeeping.
"""

from __future__ import annotations

import datetime as dt
import itertools
from dataclasses import dataclass, field

import msgspec
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from ibpool_core.pool import allocate as al
from ibpool_core.pool import mig
from ibpool_core.pool.ledger import Ledger, apply, rebuild
from ibpool_core.pool.messages import AllocationGranted, LedgerEvent, ProposePlacement, RequestAllocation, SetQuota
from ibpool_core.pool.quotas import Quota, QuotaKey, Share
from ibpool_proto.health import Cordoned, GpuFailed, NodeFailed, NodeRecovered, Uncordoned
from ibpool_proto.node import GpuInfo, NodeRegistered
from ibpool_proto.pool import (
    AllocationExpired,
    AllocationRejected,
    AllocationRevoked,
    GpuAssignment,
    ReleaseAllocation,
    RenewLease,
    ResourceRequest,
)

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
H100, A100 = "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB"
MEMORY = {H100: 81559, A100: 40960}
NODES = {"n0": H100, "n1": H100, "a0": A100}
GPUS = 2
TENANTS = ("t0", "t1", "t2")
QUEUES = ("q0", "q1")
PROFILES = sorted({p for m in NODES.values() for p in mig.MIG_PROFILES[m]})


def hops(a: str, b: str) -> int:
    return 0 if a == b else 2


@dataclass
class RefShare:
    node: str
    gpu: int
    model: str
    milli: int
    memory: int
    mig: mig.MigInstance | None = None


@dataclass
class RefAlloc:
    job: str
    tenant: str
    queue: str
    kind: str
    shares: list[RefShare]
    expires: dt.datetime
    client: str | None = None


@dataclass
class RefNode:
    model: str
    failed: bool = False
    cordoned: bool = False
    gpu_failed: set[int] = field(default_factory=set)
    uuid_tag: int = 0
    hardware_version: int = 0


@dataclass
class Reference:
    nodes: dict[str, RefNode]
    allocs: dict[str, RefAlloc] = field(default_factory=dict)
    quotas: dict[QuotaKey, Quota] = field(default_factory=dict)

    def gpu_use(self, node: str, gpu: int) -> tuple[int, int, list[mig.MigInstance]]:
        shares = [s for a in self.allocs.values() for s in a.shares if (s.node, s.gpu) == (node, gpu)]
        layout = [s.mig for s in shares if s.mig is not None]
        return sum(s.milli for s in shares), sum(s.memory for s in shares), layout

    def fits(self, node: str, gpu: int, milli: int, memory: int, profile: str | None) -> bool:
        used_milli, used_memory, layout = self.gpu_use(node, gpu)
        model = self.nodes[node].model
        if profile is not None:
            plain = used_milli > 0 and not layout
            return not plain and bool(mig.free_placements(model, layout, profile))
        if milli == 1000:
            return used_milli == 0
        return not layout and used_milli + milli <= 1000 and used_memory + memory <= MEMORY[model]

    def ready(self, node: str, gpu: int | None = None) -> bool:
        n = self.nodes[node]
        return not n.failed and not n.cordoned and (gpu is None or gpu not in n.gpu_failed)

    def usage(self) -> dict[QuotaKey, Share]:
        out: dict[QuotaKey, Share] = {}
        for a in self.allocs.values():
            for s in a.shares:
                for key in (("tenant", a.tenant, s.model), ("queue", a.queue, s.model)):
                    out[key] = out.get(key, Share()) + Share(milli=s.milli, memory_mib=s.memory)
        return out

    def admits(self, tenant: str, queue: str, model: str, milli: int, memory: int) -> bool:
        """The admission rule of quotas.py, restated."""
        usage = self.usage()
        for key in (("tenant", tenant, model), ("queue", queue, model)):
            quota = self.quotas.get(key)
            if quota is None:
                continue
            for dim, add in (("milli", milli), ("memory_mib", memory)):
                have = getattr(usage.get(key, Share()), dim)
                nominal = getattr(quota.nominal, dim)
                if add == 0 or have + add <= nominal:
                    continue
                if quota.cohort is None:
                    return False
                if quota.borrowing_limit is not None and have + add > nominal + getattr(quota.borrowing_limit, dim):
                    return False
                pool = need = 0
                for m in self.quotas.values():
                    if (m.scope, m.cohort, m.gpu_model) != (quota.scope, quota.cohort, quota.gpu_model):
                        continue
                    lendable = getattr(m.nominal, dim)
                    if m.lending_limit is not None:
                        lendable = min(lendable, getattr(m.lending_limit, dim))
                    pool += lendable
                    mine = getattr(usage.get(m.key, Share()), dim) + (add if m.key == key else 0)
                    need += max(0, mine - (getattr(m.nominal, dim) - lendable))
                if need > pool:
                    return False
        return True

    def holders(self, node: str, gpu: int | None = None) -> set[str]:
        return {i for i, a in self.allocs.items() for s in a.shares if s.node == node and gpu in (None, s.gpu)}


def share_of(model: str, milli: int, memory: int | None, profile: str | None) -> tuple[int, int]:
    if profile is not None:
        p = mig.profile_of(model, profile)
        return p.milli, p.memory_mib
    if milli == 1000:
        return 1000, MEMORY[model]
    return milli, memory if memory is not None else MEMORY[model] * milli // 1000


class LedgerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.ledger = Ledger()
        self.ref = Reference(nodes={n: RefNode(model=m) for n, m in NODES.items()})
        self.now = T0
        self.log: list[LedgerEvent] = []
        self.versions: list[int] = []
        self.answered: list[tuple[al.Input, al.Decision]] = []
        self.ids = itertools.count()
        self.known: list[str] = []
        self.usage_before: dict[QuotaKey, Share] = {}
        for node in NODES:
            self.step(self.registration(node))
            self.ref.nodes[node].hardware_version = self.ledger.version

    def registration(self, node: str) -> NodeRegistered:
        model, tag = NODES[node], self.ref.nodes[node].uuid_tag
        gpus = [
            GpuInfo(
                index=i,
                uuid=f"GPU-{node}-{i}-{tag if i == 0 else 0}",
                model=model,
                memory_mib=MEMORY[model],
                mig_capable=True,
            )
            for i in range(GPUS)
        ]
        return NodeRegistered(
            source="agent",
            key=node,
            node_id=node,
            hostname=node,
            cpu_milli=8000,
            memory_mib=64_000,
            gpus=gpus,
            backend="simulated",
        )

    def step(self, cmd: al.Input) -> al.Decision:
        self.usage_before = dict(self.ledger.usage)
        d = al.handle(self.ledger, cmd, self.now, hops=hops)
        self.log.extend(d.events)
        self.versions.append(self.ledger.version)
        return d

    def next_id(self) -> str:
        return f"c{next(self.ids)}"

    def record(self, cmd: al.Input, d: al.Decision, kind: str, tenant: str, queue: str, client: str | None) -> None:
        self.answered.append((cmd, d))
        grants = d.granted
        if not grants:
            return
        shares = []
        for g in grants:
            instances = dict(x.split(":", 1) for x in g.enforcement.mig_instances)  # "<gpu>:<profile>@<start>"
            for x in g.assignments:
                inst = None
                if str(x.gpu_index) in instances:
                    profile, start = instances[str(x.gpu_index)].split("@")
                    inst = mig.MigInstance(profile=profile, start=int(start))
                    model = NODES[g.node_id]
                    assert mig.is_valid(model, [*self.ref.gpu_use(g.node_id, x.gpu_index)[2], inst])
                assert x.memory_mib is not None
                shares.append(RefShare(g.node_id, x.gpu_index, NODES[g.node_id], x.milli, x.memory_mib, inst))
        alloc_id = grants[0].allocation_id
        self.ref.allocs[alloc_id] = RefAlloc(
            grants[0].job_id, tenant, queue, kind, shares, grants[0].lease_expires_at, client
        )
        self.known.append(alloc_id)

    # ---- grants

    @rule(data=st.data())
    def propose(self, data: st.DataObject) -> None:
        kind = data.draw(st.sampled_from(["whole", "fraction", "mig", "gang"]))
        nodes = sorted(NODES)
        tenant, queue = data.draw(st.sampled_from(TENANTS)), data.draw(st.sampled_from(QUEUES))
        version = data.draw(st.sampled_from(self.versions[-6:]))
        want: list[tuple[str, int, int, int | None, str | None]] = []  # node, gpu, milli, memory, profile
        if kind == "gang":
            pair = data.draw(st.lists(st.sampled_from(nodes), min_size=2, max_size=2, unique=True))
            count = data.draw(st.integers(1, GPUS))
            want = [(n, i, 1000, None, None) for n in pair for i in range(count)]
        else:
            node = data.draw(st.sampled_from(nodes))
            if kind == "whole":
                gpus = data.draw(st.lists(st.integers(0, GPUS - 1), min_size=1, max_size=GPUS, unique=True))
                want = [(node, i, 1000, None, None) for i in gpus]
            elif kind == "fraction":
                milli = data.draw(st.sampled_from([100, 250, 500, 700]))
                memory = data.draw(st.sampled_from([None, 4000, 30_000]))
                want = [(node, data.draw(st.integers(0, GPUS - 1)), milli, memory, None)]
            else:
                profile = data.draw(st.sampled_from(sorted(mig.MIG_PROFILES[NODES[node]])))
                want = [(node, data.draw(st.integers(0, GPUS - 1)), 1000, None, profile)]
        cmd = ProposePlacement(
            id=self.next_id(),
            source="scheduler",
            key="job",
            job_id=f"job-{len(self.answered)}",
            tenant=tenant,
            queue=queue,
            ledger_version=version,
            assignments=[
                GpuAssignment(node_id=n, gpu_index=i, milli=m, memory_mib=mem, mig_profile=p)
                for n, i, m, mem, p in want
            ],
            lease_s=data.draw(st.sampled_from([30.0, 120.0, 600.0])),
        )
        expected = self.expect_proposal(want, version, tenant, queue)
        before = self.ledger.version
        d = self.step(cmd)
        got = d.rejection.reason if d.rejection else "granted"
        if expected == "capacity":
            assert got in ("conflict", "would_exceed_capacity"), (got, d)
            assert got != "conflict" or version < before
        else:
            assert got == expected, (expected, d)
        self.record(cmd, d, "gang" if kind == "gang" else kind, tenant, queue, None)

    def expect_proposal(
        self, want: list[tuple[str, int, int, int | None, str | None]], version: int, tenant: str, queue: str
    ) -> str:
        ref = self.ref
        if any(ref.nodes[n].hardware_version > version for n, *_ in want):
            return "stale"
        if not all(ref.ready(n, i) for n, i, *_ in want):
            return "node_not_ready"
        adds: dict[str, tuple[int, int]] = {}
        for n, i, milli, memory, profile in want:
            model = NODES[n]
            m, mem = share_of(model, milli, memory, profile)
            if not ref.fits(n, i, m, mem, profile):
                return "capacity"
            old = adds.get(model, (0, 0))
            adds[model] = (old[0] + m, old[1] + mem)
        if not all(ref.admits(tenant, queue, model, m, mem) for model, (m, mem) in adds.items()):
            return "over_quota"
        return "granted"

    @rule(data=st.data())
    def request(self, data: st.DataObject) -> None:
        kind = data.draw(st.sampled_from(["whole", "fraction", "mig", "gang", "remote"]))
        model = data.draw(st.sampled_from([None, H100, A100])) if kind != "gang" else H100
        fields: dict[str, object] = {"kind": kind, "gpu_model": model}
        client = None
        if kind in ("whole", "gang"):
            fields["gpus"] = data.draw(st.integers(1, GPUS))
            fields["hosts"] = 2 if kind == "gang" else 1
        elif kind == "fraction":
            fields["milli"] = data.draw(st.sampled_from([100, 300, 600]))
            fields["memory_mib"] = data.draw(st.sampled_from([None, 8000]))
        elif kind == "mig":
            fields["mig_profile"] = data.draw(
                st.sampled_from(PROFILES if model is None else sorted(mig.MIG_PROFILES[model]))
            )
        else:
            client = data.draw(st.sampled_from(sorted(NODES)))
            fields["milli"] = data.draw(st.sampled_from([1000, 400]))
        tenant, queue = data.draw(st.sampled_from(TENANTS)), data.draw(st.sampled_from(QUEUES))
        r = msgspec.convert(fields, ResourceRequest)
        cmd = RequestAllocation(
            id=self.next_id(),
            source="scheduler",
            key="job",
            job_id=f"job-{len(self.answered)}",
            tenant=tenant,
            queue=queue,
            request=r,
            lease_s=120.0,
            client_node_id=client,
        )
        expected = self.expect_request(r, tenant, queue)
        d = self.step(cmd)
        got = d.rejection.reason if d.rejection else "granted"
        assert got == expected, (expected, d)
        self.record(cmd, d, kind, tenant, queue, client)

    def expect_request(self, r: ResourceRequest, tenant: str, queue: str) -> str:
        ref = self.ref

        def serves(model: str) -> bool:
            return r.gpu_model in (None, model) and (r.mig_profile is None or r.mig_profile in mig.MIG_PROFILES[model])

        ready = [n for n in NODES if serves(NODES[n]) and ref.ready(n) and any(ref.ready(n, i) for i in range(GPUS))]
        if not ready:
            return "node_not_ready"
        fitting = []
        for model in sorted({NODES[n] for n in ready}):
            m, mem = share_of(model, r.milli, r.memory_mib, r.mig_profile)

            def free(n: str, m: int = m, mem: int = mem) -> list[int]:
                return [i for i in range(GPUS) if ref.ready(n, i) and ref.fits(n, i, m, mem, r.mig_profile)]

            hosts = [
                n for n in ready if NODES[n] == model and len(free(n)) >= (r.gpus_per_host if r.milli == 1000 else 1)
            ]
            if len(hosts) >= r.hosts:
                fitting.append(
                    (
                        model,
                        r.gpus_per_host * r.hosts * m if r.milli == 1000 else m,
                        r.gpus_per_host * r.hosts * mem if r.milli == 1000 else mem,
                    )
                )
        if any(ref.admits(tenant, queue, model, m, mem) for model, m, mem in fitting):
            return "granted"
        return "over_quota" if fitting else "would_exceed_capacity"

    # ---- releases, leases, expiry

    @precondition(lambda self: self.known)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        alloc = data.draw(st.sampled_from(self.known))
        d = self.step(ReleaseAllocation(id=self.next_id(), source="holder", key=alloc, allocation_id=alloc))
        was_live = self.ref.allocs.pop(alloc, None) is not None
        assert bool(d.events) == (was_live or d.repeat)

    @precondition(lambda self: self.ref.allocs)
    @rule(data=st.data())
    def renew(self, data: st.DataObject) -> None:
        alloc_id = data.draw(st.sampled_from(sorted(self.ref.allocs)))
        alloc = self.ref.allocs[alloc_id]
        holder = data.draw(st.sampled_from([alloc.job, "intruder"]))
        extend = data.draw(st.sampled_from([10.0, 300.0]))
        cmd = RenewLease(
            id=self.next_id(), source="holder", key=alloc_id, allocation_id=alloc_id, holder=holder, extend_s=extend
        )
        d = self.step(cmd)
        self.answered.append((cmd, d))
        if holder == alloc.job and self.now < alloc.expires:
            alloc.expires = max(alloc.expires, self.now + dt.timedelta(seconds=extend))
            assert d.rejection is None
        else:
            assert d.rejection is not None and d.rejection.reason == "invalid"
        assert self.ledger.allocations[alloc_id].lease_expires_at == alloc.expires

    @rule(seconds=st.sampled_from([5.0, 60.0, 200.0]))
    def advance_and_expire(self, seconds: float) -> None:
        self.now += dt.timedelta(seconds=seconds)
        self.usage_before = dict(self.ledger.usage)
        d = al.expire(self.ledger, self.now)
        apply(self.ledger, d.events)
        self.log.extend(d.events)
        self.versions.append(self.ledger.version)
        due = {i for i, a in self.ref.allocs.items() if a.expires <= self.now}
        assert {e.allocation_id for e in d.events if isinstance(e, AllocationExpired)} == due
        for i in due:
            del self.ref.allocs[i]

    # ---- health

    def revoked(self, d: al.Decision) -> set[str]:
        return {e.allocation_id for e in d.events if isinstance(e, AllocationRevoked)}

    @rule(
        action=st.sampled_from(["fail", "recover", "recover", "fail_gpu", "cordon", "uncordon", "uncordon", "swap"]),
        node=st.sampled_from(sorted(NODES)),
        gpu=st.integers(0, GPUS - 1),
    )
    def health(self, action: str, node: str, gpu: int) -> None:
        ref = self.ref
        n = ref.nodes[node]
        if action == "fail":
            d = self.step(NodeFailed(source="failover", key=node, node_id=node, reason="test"))
            gone = set() if n.failed else ref.holders(node) | {i for i, a in ref.allocs.items() if a.client == node}
            n.failed = True
        elif action == "recover":
            d = self.step(NodeRecovered(source="failover", key=node, node_id=node))
            gone, n.failed = set(), False
        elif action == "fail_gpu":
            d = self.step(GpuFailed(source="failover", key=node, node_id=node, gpu_index=gpu, reason="xid"))
            gone = set() if gpu in n.gpu_failed else ref.holders(node, gpu)
            n.gpu_failed.add(gpu)
        elif action in ("cordon", "uncordon"):
            on = action == "cordon"
            news: al.Input = (
                Cordoned(source="failover", key=node, node_id=node, scope="node", reason="test")
                if on
                else Uncordoned(source="failover", key=node, node_id=node, scope="node")
            )
            d = self.step(news)
            gone, n.cordoned = set(), on
        else:  # the agent registers again with a new device as GPU 0
            n.uuid_tag += 1
            d = self.step(self.registration(node))
            gone = ref.holders(node, 0)
            n.gpu_failed.discard(0)
            n.hardware_version = self.ledger.version
        assert self.revoked(d) == gone
        for i in gone:
            del ref.allocs[i]

    # ---- quotas and repeats

    def draw_quota(self, data: st.DataObject) -> SetQuota:
        scope = data.draw(st.sampled_from(["tenant", "queue"]))
        name = data.draw(st.sampled_from(TENANTS if scope == "tenant" else QUEUES))
        amounts = st.sampled_from([0, 500, 1000, 2000, 3000])
        quota = Quota(
            scope="tenant" if scope == "tenant" else "queue",
            name=name,
            gpu_model=data.draw(st.sampled_from([H100, A100])),
            nominal=Share(milli=data.draw(amounts), memory_mib=data.draw(st.sampled_from([50_000, 200_000]))),
            borrowing_limit=data.draw(st.sampled_from([None, Share(milli=1000, memory_mib=100_000)])),
            lending_limit=data.draw(st.sampled_from([None, Share(milli=500, memory_mib=40_000)])),
            cohort=data.draw(st.sampled_from([None, "c"])),
        )
        return SetQuota(id=self.next_id(), source="api", key=name, quota=quota)

    @initialize(data=st.data(), count=st.integers(0, 4))
    def quotas_at_start(self, data: st.DataObject, count: int) -> None:
        for _ in range(count):
            self.set_quota(data)

    @rule(data=st.data())
    def set_quota(self, data: st.DataObject) -> None:
        cmd = self.draw_quota(data)
        self.step(cmd)
        self.ref.quotas[cmd.quota.key] = cmd.quota
        self.answered.append((cmd, al.Decision()))

    @precondition(lambda self: self.answered)
    @rule(data=st.data())
    def repeat(self, data: st.DataObject) -> None:
        cmd, first = data.draw(st.sampled_from(self.answered))
        version, allocs = self.ledger.version, dict(self.ledger.allocations)
        d = self.step(cmd)
        if first.events:
            assert d.repeat and d.events == first.events
        assert self.ledger.version == version and self.ledger.allocations == allocs

    # ---- invariants

    @invariant()
    def gpus_are_never_overcommitted(self) -> None:
        held: dict[tuple[str, int], list[tuple[str, int, int, mig.MigInstance | None]]] = {}
        for a in self.ledger.allocations.values():
            for g in a.grants:
                held.setdefault((g.node_id, g.gpu_index), []).append((a.allocation_id, g.milli, g.memory_mib, g.mig))
        for node in self.ledger.nodes.values():
            for gpu in node.gpus:
                shares = held.get((node.node_id, gpu.index), [])
                assert gpu.granted_milli == sum(s[1] for s in shares) <= 1000
                assert gpu.granted_memory_mib == sum(s[2] for s in shares) <= gpu.memory_mib
                assert set(gpu.holders) == {s[0] for s in shares}
                layout = [s[3] for s in shares if s[3] is not None]
                assert sorted(gpu.mig, key=lambda i: i.start) == sorted(layout, key=lambda i: i.start)
                assert mig.is_valid(gpu.model, list(gpu.mig))
                assert not layout or len(layout) == len(shares)  # a partitioned GPU holds only MIG instances

    @invariant()
    def allocations_match_the_reference_and_gangs_are_whole(self) -> None:
        assert set(self.ledger.allocations) == set(self.ref.allocs)
        for i, a in self.ledger.allocations.items():
            ref = self.ref.allocs[i]
            assert sorted((g.node_id, g.gpu_index, g.milli, g.memory_mib) for g in a.grants) == sorted(
                (s.node, s.gpu, s.milli, s.memory) for s in ref.shares
            )
            assert {g.node_id for g in a.grants} == set(a.nodes)
            if a.kind == "gang":
                assert len(a.nodes) == 2

    @invariant()
    def usage_is_summed_and_within_quota_when_it_grew(self) -> None:
        usage = self.ref.usage()
        assert self.ledger.usage == {k: v for k, v in usage.items() if not v.is_zero}
        for key, quota in self.ledger.quotas.items():
            now, before = usage.get(key, Share()), self.usage_before.get(key, Share())
            limit = quota.limit
            if limit is None:
                continue
            assert now.milli <= max(limit.milli, before.milli)
            assert now.memory_mib <= max(limit.memory_mib, before.memory_mib)

    @invariant()
    def the_event_stream_rebuilds_the_ledger(self) -> None:
        assert rebuild(self.log) == self.ledger

    def teardown(self) -> None:
        encoded = msgspec.json.encode(self.log)
        assert rebuild(msgspec.json.decode(encoded, type=list[LedgerEvent])) == self.ledger
        granted = [e for e in self.log if isinstance(e, AllocationGranted)]  # repeats included: one grant each
        assert len({e.id for e in granted}) == len({(e.allocation_id, e.node_id) for e in granted})
        assert all(e.ledger_version <= self.ledger.version for e in self.log if isinstance(e, AllocationRejected))


LedgerMachine.TestCase.settings = settings(max_examples=100, stateful_step_count=50, deadline=None)
TestLedgerStateful = LedgerMachine.TestCase
