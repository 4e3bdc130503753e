"""Packing: a pure, fast view of the cluster for placement, its fit rules, and the framework that
placement policies plug into (filter -> score -> pick, as in the Kubernetes scheduler framework).

The view
--------
`PackingCluster` holds, per node, the free CPU (milli), free memory (MiB) and per GPU the free
compute (milli, 1000 = a whole GPU), the free GPU memory (MiB) and, when the GPU is partitioned,
its MIG layout. It is mutable (`allocate` an option, `allocate_gpus` an exact assignment,
`release`) and keeps every node's *state*: a hashable
`NodeState` = (shape, free cpu, free memory, GPU states sorted in descending order). Two nodes
with the same state are interchangeable for every rule and every policy here, so the framework
scores a state once, however many nodes are in it.

A GPU state is the tuple (free milli, free memory MiB, MIG layout), the layout being a sorted
tuple of (profile, start) pairs; `()` means the GPU is not partitioned. A GPU is in MIG mode
exactly while it holds at least one instance. In a `NodeState` the GPUs are sorted in descending
order, so whole free GPUs come first; an `Option` names GPUs by their *position* in that sorted
tuple, and `allocate` maps positions back to the lowest-numbered GPUs of the node in those states.

Fit rules (as the FGD paper's simulator, plus memory and MIG)
-------------------------------------------------------------
A request fits a node when its CPU and memory fit the node's free CPU and memory, the node's GPU
model is one the request allows (`gpu_models`, empty = any) and:

* ``num_gpu == 0``: nothing more;
* a fraction (``num_gpu == 1`` and ``gpu_milli < 1000``): one unpartitioned GPU has at least
  ``gpu_milli`` free compute and ``gpu_memory_mib`` free memory; the fraction is taken there;
* whole GPUs (``gpu_milli == 1000``): ``num_gpu`` GPUs of the node are entirely free;
* a MIG instance (``mig_profile``): the model has the profile (`mig.MIG_PROFILES`) and some GPU is
  either in MIG mode with a free placement for it, or entirely free (it is then partitioned).

The framework
-------------
`fit_options(cluster, state, request)` is the filter: the distinct ways the request fits a node in
that state (one per distinct GPU state for a fraction, one for whole GPUs, one per GPU state and
start for MIG), empty when it does not fit. A `ScorePlugin` (see `policies.py`) scores a state for
a request and chooses one of its options; the framework picks the highest score, ties going to the
lowest node index. `choose` does it by scanning every node; `Packer` gives the same answer in
O(log n) per decision by keeping, per distinct request, a heap of states with their cached scores,
updated only for the states that changed since it last looked. (`touched`, the log it reads,
grows by two entries per allocation; a long-lived user should build a fresh cluster now and then.)
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple, Protocol

import msgspec

from . import mig

WHOLE = 1000
"""Milli-GPU of one whole GPU."""

GpuState = tuple[int, int, tuple[tuple[str, int], ...]]
"""(free milli, free memory MiB, MIG layout as sorted (profile, start) pairs; () = not partitioned)."""


def mig_share(profile: str) -> int:
    """The milli-GPU of a MIG profile (the same on every model that has it; 0 when none has it)."""
    for profiles in mig.MIG_PROFILES.values():
        if profile in profiles:
            return profiles[profile].milli
    return 0


class PackingError(ValueError):
    """A request or a cluster description that the rules cannot accept; the message says why."""


class NodeSpec(msgspec.Struct, frozen=True, kw_only=True):
    """A node as packing sees it. `gpu_memory_mib` is per GPU (0 = not tracked: GPU memory never
    limits a placement); `leaf` is the fabric leaf (switch) the host hangs off, "" when unknown."""

    name: str
    cpu_milli: int
    memory_mib: int
    gpu_model: str = ""
    gpus: int = 0
    gpu_memory_mib: int = 0
    leaf: str = ""


class PackRequest(msgspec.Struct, frozen=True, kw_only=True, cache_hash=True):
    """What one task asks for on one node. Hashable and compared by value: equal requests are one
    *type* for the caches and for the workload mix of the fragmentation-aware policies.

    cpu_milli, memory_mib  host CPU (milli) and memory (MiB)
    num_gpu                GPUs; 0 for a CPU-only task
    gpu_milli              compute per GPU, 1000 = whole; below 1000 only with num_gpu == 1
    gpu_memory_mib         GPU memory needed on the GPU (fractions); 0 = not constrained
    gpu_models             allowed GPU models (empty = any), e.g. from a `|`-separated gpu_spec
    mig_profile            a MIG profile name (e.g. "1g.10gb"); then num_gpu == 1 and gpu_milli
                           is the profile's share (`PackRequest.mig_instance` sets it)
    """

    cpu_milli: int = 0
    memory_mib: int = 0
    num_gpu: int = 0
    gpu_milli: int = WHOLE
    gpu_memory_mib: int = 0
    gpu_models: frozenset[str] = frozenset()
    mig_profile: str = ""

    def __post_init__(self) -> None:
        if self.cpu_milli < 0 or self.memory_mib < 0 or self.gpu_memory_mib < 0:
            raise PackingError(f"negative resources in {self}")
        if self.num_gpu < 0:
            raise PackingError(f"num_gpu must be >= 0, got {self.num_gpu}")
        if self.num_gpu > 0 and not 0 < self.gpu_milli <= WHOLE:
            raise PackingError(f"gpu_milli must be in 1..{WHOLE}, got {self.gpu_milli}")
        if self.num_gpu > 1 and self.gpu_milli < WHOLE:
            raise PackingError(f"a fraction of a GPU ({self.gpu_milli} milli) is for num_gpu == 1, not {self.num_gpu}")
        if self.mig_profile:
            if self.num_gpu != 1:
                raise PackingError(f"a MIG instance is one GPU's slice: num_gpu must be 1, got {self.num_gpu}")
            share = mig_share(self.mig_profile)
            if not share:
                raise PackingError(f"no GPU model has the MIG profile {self.mig_profile!r}")
            if self.gpu_milli != share:
                raise PackingError(
                    f"a {self.mig_profile} instance counts {share} milli; gpu_milli is {self.gpu_milli} "
                    "(use PackRequest.mig_instance)"
                )

    @classmethod
    def mig_instance(
        cls, profile: str, *, cpu_milli: int = 0, memory_mib: int = 0, gpu_models: frozenset[str] = frozenset()
    ) -> PackRequest:
        """A request for one MIG instance of `profile`, counted as the profile's compute share."""
        return cls(
            cpu_milli=cpu_milli,
            memory_mib=memory_mib,
            num_gpu=1,
            gpu_milli=mig_share(profile) or WHOLE,
            gpu_models=gpu_models,
            mig_profile=profile,
        )

    @property
    def is_fraction(self) -> bool:
        return self.num_gpu == 1 and self.gpu_milli < WHOLE and not self.mig_profile

    @property
    def gpu_demand_milli(self) -> int:
        """GPU compute asked, in milli (num_gpu x gpu_milli)."""
        return self.num_gpu * self.gpu_milli

    @staticmethod
    def models_from_spec(gpu_spec: str) -> frozenset[str]:
        """`"V100M16|V100M32"` -> {"V100M16", "V100M32"}; "" (or "nan") -> any model."""
        parts = {p.strip() for p in gpu_spec.split("|")}
        return frozenset(p for p in parts if p and p.lower() != "nan")


class NodeShape(NamedTuple):
    """What does not change on a node: its capacities, GPU model and leaf."""

    gpu_model: str
    gpus: int
    cpu_milli: int
    memory_mib: int
    gpu_memory_mib: int
    leaf: str
    mig_capable: bool


class NodeState(NamedTuple):
    """The packing state of a node; equal states are interchangeable (see the module docstring)."""

    shape: int
    cpu_free: int
    mem_free: int
    gpus: tuple[GpuState, ...]


class Option(NamedTuple):
    """One way a request fits a node state: GPU positions in `NodeState.gpus`, and the MIG start
    slice (-1 when not a MIG request)."""

    positions: tuple[int, ...]
    mig_start: int = -1


class Placement(msgspec.Struct, frozen=True, kw_only=True):
    """A request placed: node index and name, GPU indices on the node, MIG start (-1 = none) and
    the milli-GPU it holds (what `release` gives back)."""

    node: int
    node_name: str
    gpus: tuple[int, ...]
    mig_start: int = -1
    gpu_milli: int = 0


class PackingCluster:
    """The mutable packing view of a cluster (see the module docstring).

    `mig_layouts` optionally pre-partitions GPUs: (node index, GPU index) -> instances.
    Reading: `state(n)`, `groups` (state -> nodes in it), `group_min` (state -> lowest node index),
    `touched` (append-only log of states whose membership changed, for incremental consumers).
    """

    def __init__(
        self,
        nodes: Sequence[NodeSpec],
        mig_layouts: Mapping[tuple[int, int], Sequence[mig.MigInstance]] | None = None,
    ) -> None:
        self.nodes: tuple[NodeSpec, ...] = tuple(nodes)
        shape_ids: dict[NodeShape, int] = {}
        self.shapes: list[NodeShape] = []
        self.shape_of: list[int] = []
        for spec in self.nodes:
            if spec.gpus < 0 or spec.cpu_milli < 0 or spec.memory_mib < 0:
                raise PackingError(f"node {spec.name}: negative capacity")
            shape = NodeShape(
                spec.gpu_model,
                spec.gpus,
                spec.cpu_milli,
                spec.memory_mib,
                spec.gpu_memory_mib,
                spec.leaf,
                spec.gpu_model in mig.MIG_PROFILES,
            )
            if shape not in shape_ids:
                shape_ids[shape] = len(self.shapes)
                self.shapes.append(shape)
            self.shape_of.append(shape_ids[shape])
        self.cpu_free: list[int] = [s.cpu_milli for s in self.nodes]
        self.mem_free: list[int] = [s.memory_mib for s in self.nodes]
        self.gpu: list[list[GpuState]] = [[(WHOLE, s.gpu_memory_mib, ())] * s.gpus for s in self.nodes]
        for (n, g), layout in (mig_layouts or {}).items():
            spec = self.nodes[n]
            insts = list(layout)
            if insts and not mig.is_valid(spec.gpu_model, insts):
                raise PackingError(f"node {spec.name} GPU {g}: invalid MIG layout {insts}")
            used_milli = sum(mig.profile_of(spec.gpu_model, i.profile).milli for i in insts)
            used_mem = sum(mig.profile_of(spec.gpu_model, i.profile).memory_mib for i in insts)
            pairs = tuple(sorted((i.profile, i.start) for i in insts))
            self.gpu[n][g] = (WHOLE - used_milli, max(0, spec.gpu_memory_mib - used_mem), pairs)
        self.capacity_milli = WHOLE * sum(s.gpus for s in self.nodes)
        self.allocated_milli = WHOLE * sum(s.gpus for s in self.nodes) - sum(g[0] for gpus in self.gpu for g in gpus)
        self.max_cpu = max((s.cpu_milli for s in self.nodes), default=1) or 1
        self.max_mem = max((s.memory_mib for s in self.nodes), default=1) or 1
        self.max_gpu_milli = WHOLE * (max((s.gpus for s in self.nodes), default=1) or 1)
        self._state: list[NodeState] = []
        self._order: list[list[int]] = []
        self.groups: dict[NodeState, set[int]] = {}
        self.group_min: dict[NodeState, int] = {}
        self.touched: list[NodeState] = []
        for n in range(len(self.nodes)):
            st, order = self._compute_state(n)
            self._state.append(st)
            self._order.append(order)
            self._join(n, st)

    def __len__(self) -> int:
        return len(self.nodes)

    def state(self, node: int) -> NodeState:
        return self._state[node]

    def free_milli(self) -> int:
        return self.capacity_milli - self.allocated_milli

    def _compute_state(self, n: int) -> tuple[NodeState, list[int]]:
        gpus = self.gpu[n]
        order = sorted(range(len(gpus)), key=lambda i: (gpus[i], -i), reverse=True)
        st = NodeState(self.shape_of[n], self.cpu_free[n], self.mem_free[n], tuple(gpus[i] for i in order))
        return st, order

    def _join(self, n: int, st: NodeState) -> None:
        members = self.groups.get(st)
        if members is None:
            self.groups[st] = {n}
            self.group_min[st] = n
        else:
            members.add(n)
            if n < self.group_min[st]:
                self.group_min[st] = n
        self.touched.append(st)

    def _leave(self, n: int, st: NodeState) -> None:
        members = self.groups[st]
        members.discard(n)
        if not members:
            del self.groups[st]
            del self.group_min[st]
        elif self.group_min[st] == n:
            self.group_min[st] = min(members)
        self.touched.append(st)

    def _update(self, n: int) -> None:
        old = self._state[n]
        st, order = self._compute_state(n)
        self._order[n] = order
        if st != old:
            self._leave(n, old)
            self._state[n] = st
            self._join(n, st)

    def fits(self, node: int, request: PackRequest) -> bool:
        return bool(fit_options(self, self._state[node], request))

    def allocate(self, node: int, request: PackRequest, option: Option) -> Placement:
        """Take `request` on `node` as `option` says (positions in the node's current state).

        Raises PackingError when the option does not fit: callers get options from `fit_options`.
        """
        order = self._order[node]
        if any(not 0 <= p < len(order) for p in option.positions):
            raise PackingError(f"option {option} names GPU positions the node does not have")
        return self.allocate_gpus(node, request, tuple(order[p] for p in option.positions), option.mig_start)

    def allocate_gpus(
        self, node: int, request: PackRequest, gpu_ids: tuple[int, ...], mig_start: int = -1
    ) -> Placement:
        """Take `request` on `node`'s GPUs `gpu_ids` (GPU indices; `mig_start` for a MIG instance),
        e.g. an exact assignment proposed by a scheduler. Raises PackingError when it does not fit;
        nothing is taken then."""
        st = self._state[node]
        if self.cpu_free[node] < request.cpu_milli or self.mem_free[node] < request.memory_mib:
            raise PackingError(f"{request} does not fit node {self.nodes[node].name}: cpu or memory")
        if request.num_gpu and request.gpu_models and self.nodes[node].gpu_model not in request.gpu_models:
            raise PackingError(
                f"node {self.nodes[node].name} has {self.nodes[node].gpu_model}, not one of {request.gpu_models}"
            )
        if len(set(gpu_ids)) != len(gpu_ids) or len(gpu_ids) != request.num_gpu:
            raise PackingError(f"{len(set(gpu_ids))} distinct GPUs named for num_gpu {request.num_gpu}")
        if any(not 0 <= g < len(self.gpu[node]) for g in gpu_ids):
            raise PackingError(f"node {self.nodes[node].name} has no GPU {gpu_ids}")
        model = self.shapes[st.shape].gpu_model
        if request.mig_profile and request.mig_profile not in mig.MIG_PROFILES.get(model, {}):
            raise PackingError(f"node {self.nodes[node].name} ({model}) has no MIG profile {request.mig_profile}")
        new: list[GpuState] = []
        milli = 0
        for g in gpu_ids:
            free, mem, layout = self.gpu[node][g]
            if request.mig_profile:
                prof = mig.profile_of(model, request.mig_profile)
                if not _mig_start_ok(model, free, layout, request.mig_profile, mig_start):
                    raise PackingError(f"MIG {request.mig_profile}@{mig_start} does not fit GPU {g}")
                pairs = tuple(sorted((*layout, (request.mig_profile, mig_start))))
                new.append((free - prof.milli, max(0, mem - prof.memory_mib), pairs))
                milli += prof.milli
            elif request.gpu_milli < WHOLE:
                if layout or free < request.gpu_milli or mem < request.gpu_memory_mib:
                    raise PackingError(f"{request.gpu_milli} milli does not fit GPU {g} ({free} free)")
                new.append((free - request.gpu_milli, mem - request.gpu_memory_mib, layout))
                milli += request.gpu_milli
            else:
                if layout or free < WHOLE:
                    raise PackingError(f"GPU {g} of {self.nodes[node].name} is not entirely free")
                new.append((0, 0, ()))
                milli += WHOLE
        for g, gs in zip(gpu_ids, new, strict=True):
            self.gpu[node][g] = gs
        self.cpu_free[node] -= request.cpu_milli
        self.mem_free[node] -= request.memory_mib
        self.allocated_milli += milli
        self._update(node)
        return Placement(
            node=node,
            node_name=self.nodes[node].name,
            gpus=gpu_ids,
            mig_start=mig_start if request.mig_profile else -1,
            gpu_milli=milli,
        )

    def release(self, placement: Placement, request: PackRequest) -> None:
        """Give back what `allocate` took for `request` as `placement`."""
        n = placement.node
        spec = self.nodes[n]
        for g in placement.gpus:
            free, mem, layout = self.gpu[n][g]
            if request.mig_profile:
                prof = mig.profile_of(spec.gpu_model, request.mig_profile)
                pairs = list(layout)
                pairs.remove((request.mig_profile, placement.mig_start))
                self.gpu[n][g] = (free + prof.milli, min(spec.gpu_memory_mib, mem + prof.memory_mib), tuple(pairs))
            elif request.gpu_milli < WHOLE:
                self.gpu[n][g] = (free + request.gpu_milli, mem + request.gpu_memory_mib, layout)
            else:
                self.gpu[n][g] = (WHOLE, spec.gpu_memory_mib, ())
        self.cpu_free[n] += request.cpu_milli
        self.mem_free[n] += request.memory_mib
        self.allocated_milli -= placement.gpu_milli
        self._update(n)


def _mig_start_ok(model: str, free: int, layout: tuple[tuple[str, int], ...], profile: str, start: int) -> bool:
    if not layout and free < WHOLE:
        return False  # a GPU shared by fractions cannot be partitioned
    insts = [mig.MigInstance(profile=p, start=s) for p, s in layout]
    return start in mig.free_placements(model, insts, profile)


def _model_ok(shape: NodeShape, request: PackRequest) -> bool:
    return not request.gpu_models or shape.gpu_model in request.gpu_models


def fit_options(cluster: PackingCluster, state: NodeState, request: PackRequest) -> list[Option]:
    """The filter: the distinct ways `request` fits a node in `state` (empty = it does not fit).

    Options are listed in the order of `state.gpus` (most free first); for a fraction there is one
    option per distinct GPU state that fits.
    """
    if state.cpu_free < request.cpu_milli or state.mem_free < request.memory_mib:
        return []
    if request.num_gpu == 0:
        return [Option(())]
    shape = cluster.shapes[state.shape]
    if request.gpu_models and shape.gpu_model not in request.gpu_models:
        return []
    gpus = state.gpus
    if request.mig_profile:
        return _mig_options(shape, gpus, request.mig_profile)
    need = request.gpu_milli
    if need < WHOLE:
        out: list[Option] = []
        prev: GpuState | None = None
        for p, g in enumerate(gpus):
            if g[0] < need:
                break  # sorted: no later GPU has more free
            if g != prev and not g[2] and g[1] >= request.gpu_memory_mib:
                out.append(Option((p,)))
            prev = g
        return out
    k = request.num_gpu
    if len(gpus) < k or gpus[k - 1][0] < WHOLE or gpus[k - 1][2]:
        return []
    return [Option(tuple(range(k)))]


def _mig_options(shape: NodeShape, gpus: tuple[GpuState, ...], profile: str) -> list[Option]:
    model = shape.gpu_model
    if not shape.mig_capable or profile not in mig.MIG_PROFILES[model]:
        return []
    out: list[Option] = []
    seen: set[GpuState] = set()
    for p, g in enumerate(gpus):
        if g in seen:
            continue
        seen.add(g)
        free, _, layout = g
        if not layout and free < WHOLE:
            continue
        insts = [mig.MigInstance(profile=q, start=s) for q, s in layout]
        out.extend(Option((p,), s) for s in mig.free_placements(model, insts, profile))
    return out


def after_state(cluster: PackingCluster, state: NodeState, request: PackRequest, option: Option) -> NodeState:
    """The state a node in `state` would have after taking `request` as `option` (no checks)."""
    gpus = list(state.gpus)
    if request.num_gpu:
        shape = cluster.shapes[state.shape]
        for p in option.positions:
            free, mem, layout = gpus[p]
            if request.mig_profile:
                prof = mig.profile_of(shape.gpu_model, request.mig_profile)
                gpus[p] = (
                    free - prof.milli,
                    max(0, mem - prof.memory_mib),
                    tuple(sorted((*layout, (request.mig_profile, option.mig_start)))),
                )
            elif request.gpu_milli < WHOLE:
                gpus[p] = (free - request.gpu_milli, mem - request.gpu_memory_mib, layout)
            else:
                gpus[p] = (0, 0, ())
        gpus.sort(reverse=True)
    return NodeState(state.shape, state.cpu_free - request.cpu_milli, state.mem_free - request.memory_mib, tuple(gpus))


Score = tuple[float, ...]
"""Higher is better; compared lexicographically (later entries break ties of earlier ones)."""


class Scored(NamedTuple):
    score: Score
    option: Option


class ScorePlugin(Protocol):
    """A placement policy (contract; implementations and the registry are in `policies.py`).

    observe(request)  called once per arriving request, before it is placed (online learning);
    version()         changes whenever the scores the plugin gives may have changed for an
                      unchanged node state (e.g. a new workload mix): cached scores are dropped;
    score(cluster, state, request, options)
                      `options` is the non-empty filter output for a node in `state`; return the
                      score of placing there (higher is better) and the option to use. It must be a
                      function of (state, request, version) only: equal states get equal scores.
    """

    name: str

    def observe(self, request: PackRequest) -> None: ...

    def version(self) -> int: ...

    def score(
        self, cluster: PackingCluster, state: NodeState, request: PackRequest, options: list[Option]
    ) -> Scored: ...


def choose(cluster: PackingCluster, policy: ScorePlugin, request: PackRequest) -> tuple[int, Option] | None:
    """Filter, score and pick by scanning every node: the reference `Packer` must agree with.

    Returns (node, option) with the highest score, ties to the lowest node index; None when the
    request fits nowhere. Does not call `policy.observe`.
    """
    best: tuple[Score, int, Option] | None = None
    for n in range(len(cluster)):
        st = cluster.state(n)
        opts = fit_options(cluster, st, request)
        if not opts:
            continue
        s = policy.score(cluster, st, request, opts)
        if best is None or s.score > best[0]:
            best = (s.score, n, s.option)
    return None if best is None else (best[1], best[2])


_HeapItem = tuple[tuple[float, ...], int, int, NodeState, Option]


class Packer:
    """Places requests one by one with a policy, as `choose` would, but fast.

    Per distinct request it keeps a heap of (negated score, lowest node index, state, option) over
    the node states, built on first use and then brought up to date from `cluster.touched` (only
    the states that changed); scores are cached per (state, request) until the policy's version
    changes. A decision costs O(changed states x score + log n) instead of O(nodes x score).
    """

    def __init__(self, cluster: PackingCluster, policy: ScorePlugin) -> None:
        self.cluster = cluster
        self.policy = policy
        self._version: int | None = None
        self._scores: dict[NodeState, dict[PackRequest, Scored | None]] = {}
        self._heaps: dict[PackRequest, list[_HeapItem]] = {}
        self._cursor: dict[PackRequest, int] = {}
        self._seen = 0
        self._seq = 0
        self.scored = 0  # number of score() calls, for benchmarks

    def _scored(self, st: NodeState, request: PackRequest) -> Scored | None:
        per = self._scores.get(st)
        if per is None:
            per = self._scores[st] = {}
        elif request in per:
            return per[request]
        opts = fit_options(self.cluster, st, request)
        s = self.policy.score(self.cluster, st, request, opts) if opts else None
        if opts:
            self.scored += 1
        per[request] = s
        return s

    def _push(self, heap: list[_HeapItem], states: Iterable[NodeState], request: PackRequest) -> None:
        group_min = self.cluster.group_min
        for st in states:
            m = group_min.get(st)
            if m is None:
                continue
            s = self._scored(st, request)
            if s is not None:
                self._seq += 1
                heapq.heappush(heap, (tuple(-x for x in s.score), m, self._seq, st, s.option))

    def decide(self, request: PackRequest) -> tuple[int, Option] | None:
        """Observe `request` and return where it goes (node, option), or None; nothing is taken."""
        self.policy.observe(request)
        version = self.policy.version()
        cluster = self.cluster
        log = cluster.touched
        if version != self._version:
            self._version = version
            self._scores.clear()
            self._heaps.clear()
            self._cursor.clear()
        else:
            for st in log[self._seen :]:
                if st not in cluster.groups:
                    self._scores.pop(st, None)
        self._seen = len(log)
        heap = self._heaps.get(request)
        if heap is None or len(heap) > 4 * len(cluster.groups) + 64:
            heap = self._heaps[request] = []
            self._push(heap, list(cluster.groups), request)
        else:
            start = self._cursor[request]
            if start < len(log):
                self._push(heap, dict.fromkeys(log[start:]), request)
        self._cursor[request] = len(log)
        group_min = cluster.group_min
        while heap:
            _, m, _, st, option = heap[0]
            if group_min.get(st) == m:
                return m, option
            heapq.heappop(heap)
        return None

    def place(self, request: PackRequest) -> Placement | None:
        """Observe, decide and allocate; None when the request fits nowhere (it is rejected)."""
        decision = self.decide(request)
        if decision is None:
            return None
        return self.cluster.allocate(decision[0], request, decision[1])
