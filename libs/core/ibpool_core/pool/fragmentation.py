"""GPU fragmentation as the FGD paper measures it, and the workload mix it is measured against.

Weng et al., "Beware of Fragmentation: Scheduling GPU-Sharing Workloads with Fragmentation Gradient
Descent", USENIX ATC'23. For a node n and a task type m, the *fragment* F_n(m) is the free GPU
compute of n that m cannot use:

* m cannot run on n at all (its CPU, memory or GPU model does not fit, or not enough GPUs are
  free for it, or it asks no GPU): every free GPU milli of n is a fragment;
* otherwise the GPUs that m could not be placed on are fragments: for a fraction of `d` milli the
  GPUs with less than `d` free; for whole GPUs every GPU that is not entirely free.

The node's fragmentation for a workload mix M (task types m with popularity p_m) is the expected
fragment F_n(M) = sum_m p_m F_n(m), and the cluster's is the sum over its nodes. FGD places a task
where F_n(M) grows least (the "gradient").

Here F_n(M) is computed as W * R - sum_s U_s * P_s, with W the total weight of the mix, R the
node's free GPU milli, s the distinct GPU shapes of the mix (GPUs, milli, GPU memory, models, MIG
profile), U_s the milli a task of shape s could use on the node (0 when it cannot be placed) and P_s
the weight of the types of shape s whose CPU (and, if `memory_aware`, memory) fit the node. Both
factors are cached (P by free CPU/memory, U by GPU state), so a node costs one dot product. Integer
weights keep it exact: equal fragmentations compare equal.

Beyond the paper (the `fgd+` policy turns these on):

* `memory_aware`: a type whose host memory does not fit the node cannot run there (the paper's
  simulator looks at CPU only);
* `mig_aware`: a MIG profile's usable compute on a GPU is the number of further instances of it
  that still fit the GPU's layout (`mig.place`) times the profile's share, so layouts that strand
  slices count as fragments; without it a MIG request is measured as a plain fraction of its milli;
* `host_weight` h in [0, 1]: the fragment of a type that shares a GPU (a fraction or a MIG
  instance) of d milli is h x (its host-capped fragment) + (1 - h) x (the paper's). The host-capped
  one caps the usable GPU by the tasks of that type the host can still take, k x d with
  k = min(free CPU // the type's CPU, free memory // its memory): GPU stranded by the host's CPU
  or memory counts as a fragment before the type stops fitting at all. Whole-GPU types keep the
  paper's rule (capping them too makes the nodes with the most CPU look cheap to break). h is kept
  as a small fraction p/q and F is computed x q in integers, so equal values still compare equal.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable, Sequence
from fractions import Fraction

from . import mig
from .packing import WHOLE, GpuState, NodeShape, NodeState, PackingCluster, PackRequest

_CACHE_MAX = 200_000


class WorkloadMix:
    """The pod-type distribution, learned online from the most recent `window` requests.

    `observe` records a request; the distribution in use (`types()`) is a snapshot of the window
    taken at arrivals 1, 2, 4, ... and then every `refresh` arrivals, so consumers that cache
    scores against it (see `version`) are not invalidated on every arrival. `fixed()` makes a mix
    that never changes (e.g. the popularity of a whole trace, as in the paper's simulator).
    """

    def __init__(self, window: int = 5000, refresh: int = 1000) -> None:
        if window < 1 or refresh < 1:
            raise ValueError("window and refresh must be >= 1")
        self.window = window
        self.refresh = refresh
        self._recent: deque[PackRequest] = deque()
        self._counts: Counter[PackRequest] = Counter()
        self._types: tuple[tuple[PackRequest, int], ...] = ()
        self._version = 0
        self._seen = 0
        self._next = 1
        self._frozen = False

    @classmethod
    def fixed(cls, types: Iterable[tuple[PackRequest, int]]) -> WorkloadMix:
        mix = cls()
        mix._types = tuple((t, w) for t, w in types if w > 0)
        mix._frozen = True
        mix._version = 1
        return mix

    @property
    def version(self) -> int:
        return self._version

    def observe(self, request: PackRequest) -> None:
        if self._frozen:
            return
        self._recent.append(request)
        self._counts[request] += 1
        if len(self._recent) > self.window:
            old = self._recent.popleft()
            self._counts[old] -= 1
            if not self._counts[old]:
                del self._counts[old]
        self._seen += 1
        if self._seen >= self._next:
            self._types = tuple(sorted(self._counts.items(), key=lambda kv: -kv[1]))
            self._version += 1
            self._next = self._seen + min(self.refresh, self._seen)

    def types(self) -> tuple[tuple[PackRequest, int], ...]:
        """(type, weight) pairs, most popular first; weights are counts (probability = w / total)."""
        return self._types


_GpuShape = tuple[int, int, int, frozenset[str], str]  # num_gpu, gpu_milli, gpu_memory_mib, models, mig_profile


def _mig_capacity(model: str, free: int, layout: tuple[tuple[str, int], ...], profile: str) -> int:
    """How many more instances of `profile` fit a GPU (a GPU shared by fractions takes none)."""
    if not layout and free < WHOLE:
        return 0
    insts = [mig.MigInstance(profile=p, start=s) for p, s in layout]
    n = 0
    while (inst := mig.place(model, insts, profile)) is not None:
        insts.append(inst)
        n += 1
    return n


class FragModel:
    """F_n(M) for one workload mix (see the module docstring); build a new one for a new mix."""

    def __init__(
        self,
        cluster: PackingCluster,
        types: Sequence[tuple[PackRequest, int]],
        *,
        memory_aware: bool = False,
        mig_aware: bool = False,
        host_weight: float = 0.0,
    ) -> None:
        if not 0.0 <= host_weight <= 1.0:
            raise ValueError(f"host_weight must be in [0, 1], got {host_weight}")
        self.cluster = cluster
        self.memory_aware = memory_aware
        self.mig_aware = mig_aware
        h = Fraction(host_weight).limit_denominator(64)
        self._host, self._scale = h.numerator, h.denominator  # F x W x scale = host x H + paper x (scale - H)
        index: dict[_GpuShape, int] = {}
        rows: list[list[tuple[int, int, int]]] = []
        self.total = 0
        for t, w in types:
            key = (t.num_gpu, t.gpu_milli, t.gpu_memory_mib, t.gpu_models, t.mig_profile)
            if key not in index:
                index[key] = len(rows)
                rows.append([])
            rows[index[key]].append((t.cpu_milli, t.memory_mib, w))
            self.total += w
        self.shapes: list[_GpuShape] = list(index)
        self._rows = rows
        # with a host weight, whole-GPU (and CPU-only) shapes still go through P x U and each type
        # sharing a GPU (a fraction or a MIG instance) is looked at one by one
        self._whole = [i for i, sh in enumerate(self.shapes) if not (sh[4] or sh[1] < WHOLE)]
        self._sharing: list[tuple[int, int, tuple[tuple[int, int, int], ...]]] = []  # shape, milli, (cpu, mem, w)
        for i, sh in enumerate(self.shapes):
            if sh[4] or sh[1] < WHOLE:
                self._sharing.append((i, sh[1], tuple(rows[i])))
        self._p: dict[tuple[int, int], tuple[int, ...]] = {}
        self._u: dict[tuple[int, tuple[GpuState, ...]], tuple[int, ...]] = {}
        self._f: dict[NodeState, int] = {}
        self._mig: dict[tuple[str, tuple[tuple[str, int], ...], str], int] = {}

    def weights_fitting(self, cpu_free: int, mem_free: int) -> tuple[int, ...]:
        """P_s: per GPU shape, the weight of its types whose CPU (and memory) fit."""
        key = (cpu_free, mem_free if self.memory_aware else 0)
        p = self._p.get(key)
        if p is None:
            if len(self._p) > _CACHE_MAX:
                self._p.clear()
            if self.memory_aware:
                p = tuple(sum(w for c, m, w in row if c <= cpu_free and m <= mem_free) for row in self._rows)
            else:
                p = tuple(sum(w for c, _, w in row if c <= cpu_free) for row in self._rows)
            self._p[key] = p
        return p

    def usable(self, shape_id: int, gpus: tuple[GpuState, ...]) -> tuple[int, ...]:
        """U_s: per GPU shape, the milli of the node's free GPU a task of that shape could use."""
        key = (shape_id, gpus)
        u = self._u.get(key)
        if u is None:
            if len(self._u) > _CACHE_MAX:
                self._u.clear()
            shape = self.cluster.shapes[shape_id]
            u = tuple(self._usable_one(shape, gpus, s) for s in self.shapes)
            self._u[key] = u
        return u

    def _usable_one(self, shape: NodeShape, gpus: tuple[GpuState, ...], s: _GpuShape) -> int:
        num, milli, gmem, models, profile = s
        if num == 0 or (models and shape.gpu_model not in models):
            return 0
        if profile and self.mig_aware:
            if not shape.mig_capable or profile not in mig.MIG_PROFILES[shape.gpu_model]:
                return 0
            share = mig.profile_of(shape.gpu_model, profile).milli
            total = 0
            for free, _, layout in gpus:
                key = (shape.gpu_model, layout, profile)
                n = self._mig.get(key) if layout or free == WHOLE else 0
                if n is None:
                    n = self._mig[key] = _mig_capacity(shape.gpu_model, free, layout, profile)
                total += n * share
            return total
        if profile:  # not MIG-aware: measured as a plain fraction of the profile's share
            if not shape.mig_capable or profile not in mig.MIG_PROFILES[shape.gpu_model]:
                return 0
            milli = mig.profile_of(shape.gpu_model, profile).milli
        if milli < WHOLE:
            return sum(free for free, mem, layout in gpus if free >= milli and mem >= gmem and not layout)
        full = sum(1 for free, _, layout in gpus if free >= WHOLE and not layout)
        return WHOLE * full if full >= num else 0

    def frag(self, state: NodeState) -> int:
        """F_n(M) x W (x the host weight's denominator; an integer) for a node in `state`."""
        f = self._f.get(state)
        if f is None:
            if len(self._f) > _CACHE_MAX:
                self._f.clear()
            f = self._f[state] = self.frag_uncached(state)
        return f

    def frag_uncached(self, state: NodeState) -> int:
        free = 0
        for g in state.gpus:
            free += g[0]
        if free == 0:
            return 0
        p = self.weights_fitting(state.cpu_free, state.mem_free)
        u = self.usable(state.shape, state.gpus)
        if not self._host:
            return self.total * free - sum(a * b for a, b in zip(u, p, strict=True))
        used = 0  # the paper's usable, weighted
        capped = 0  # the host-capped usable of the GPU-sharing types, weighted
        for i in self._whole:
            used += u[i] * p[i]
        whole_used = used
        cpu, mem, mem_aware = state.cpu_free, state.mem_free, self.memory_aware
        for si, per, row in self._sharing:
            top = u[si]
            if not top:
                continue
            for c, m, w in row:
                if c > cpu or (mem_aware and m > mem):
                    continue
                used += w * top
                us = top
                if c:
                    cap = cpu // c * per
                    if cap < us:
                        us = cap
                if mem_aware and m:
                    cap = mem // m * per
                    if cap < us:
                        us = cap
                capped += w * us
        host, scale = self._host, self._scale
        return scale * self.total * free - host * (whole_used + capped) - (scale - host) * used

    def node_fraction(self, state: NodeState) -> float:
        """F_n(M) in GPUs (the expected fragment, W normalised away)."""
        return self.frag(state) / (self._scale * self.total * WHOLE) if self.total else 0.0

    def cluster_fraction(self) -> float:
        """The cluster's expected fragment in GPUs, summed over nodes."""
        return sum(self.node_fraction(st) * len(nodes) for st, nodes in self.cluster.groups.items())


def fragment(gpus_free: Sequence[int], cpu_free: int, request: PackRequest) -> int:
    """F_n(m) in milli for a plain node, straight from the paper's definition (the reference the
    fast `FragModel` is tested against): `gpus_free` per GPU milli, `cpu_free` the node's CPU."""
    total = sum(gpus_free)
    if request.num_gpu == 0 or cpu_free < request.cpu_milli:
        return total
    if request.gpu_milli < WHOLE:
        if not any(f >= request.gpu_milli for f in gpus_free):
            return total
        return sum(f for f in gpus_free if f < request.gpu_milli)
    if sum(1 for f in gpus_free if f >= WHOLE) < request.num_gpu:
        return total
    return sum(f for f in gpus_free if f < WHOLE)
