"""Placement policies: scorer plugins for the packing framework, and their registry.

Every policy follows the `packing.ScorePlugin` contract: the framework filters nodes with the fit
rules (`packing.fit_options`), asks the policy to score each remaining node state and to choose
one of its options, and picks the highest score, ties going to the lowest node index. Scores
depend only on the node state, the request and the policy's version, so they can be cached.

Registry: `POLICIES` maps a name to a factory (no arguments); `make_policy(name)` builds one,
`register(name, factory)` adds one.

| name        | node score (higher wins)                               | GPU on the node           |
|-------------|--------------------------------------------------------|---------------------------|
| first-fit   | the same for every node: the lowest index wins         | the most free one         |
| best-fit    | least CPU + GPU left after placing (each / cluster max)| the least free that fits  |
| worst-fit   | most CPU + GPU left after placing (spreads)            | the most free             |
| dot-product | Tetris alignment: request . free, per node capacity    | the least free that fits  |
| fgd         | least growth of expected fragmentation (FGD, ATC'23)   | the one growing it least  |
| fgd+        | fgd's growth, fragments also counting GPU stranded by  | the one growing it least, |
|             | host CPU/memory and MIG layouts; ties: best-fit        | then the least free       |
"""

from __future__ import annotations

from collections.abc import Callable

from .fragmentation import FragModel, WorkloadMix
from .packing import (
    WHOLE,
    NodeState,
    Option,
    PackingCluster,
    PackRequest,
    Scored,
    ScorePlugin,
    after_state,
)


def _free_milli(state: NodeState) -> int:
    return sum(g[0] for g in state.gpus)


def _gpu_left(state: NodeState, request: PackRequest, option: Option) -> int:
    """Free milli left on the (first) GPU the option uses; 0 for whole GPUs and CPU-only tasks."""
    if not option.positions or (request.gpu_milli >= WHOLE and not request.mig_profile):
        return 0
    return state.gpus[option.positions[0]][0] - request.gpu_milli


def _tightest(state: NodeState, request: PackRequest, options: list[Option]) -> tuple[int, Option]:
    """The option leaving the least free compute on its GPU (first such in state order)."""
    best = options[0]
    left = _gpu_left(state, request, best)
    for o in options[1:]:
        x = _gpu_left(state, request, o)
        if x < left:
            best, left = o, x
    return left, best


class _Static:
    """Base of the policies that learn nothing: observe() does nothing, the version never changes."""

    name = ""

    def observe(self, request: PackRequest) -> None:
        return None

    def version(self) -> int:
        return 0


class FirstFit(_Static):
    """first-fit. Filter: the fit rules. Score: 0 for every node that fits, so the lowest node
    index wins. Pick on the node: the option listed first (the GPU with the most free compute)."""

    name = "first-fit"

    def score(self, cluster: PackingCluster, state: NodeState, request: PackRequest, options: list[Option]) -> Scored:
        return Scored((0,), options[0])


def _left_after(cluster: PackingCluster, state: NodeState, request: PackRequest) -> int:
    """CPU/cluster max CPU + GPU/cluster max GPU left on the node after placing, scaled to an integer."""
    cpu_left = state.cpu_free - request.cpu_milli
    gpu_left = _free_milli(state) - request.gpu_demand_milli
    return cpu_left * cluster.max_gpu_milli + gpu_left * cluster.max_cpu


class BestFit(_Static):
    """best-fit. Filter: the fit rules. Score: minus what the node has left after placing, as
    CPU left / the cluster's largest node CPU + GPU milli left / the largest node GPU milli (the
    FGD simulator's best-fit, weights 1:1), so the fullest node that fits wins. Pick on the node:
    the GPU the fraction fits most tightly (least left over)."""

    name = "best-fit"

    def score(self, cluster: PackingCluster, state: NodeState, request: PackRequest, options: list[Option]) -> Scored:
        left, option = _tightest(state, request, options)
        return Scored((-_left_after(cluster, state, request), -left), option)


class WorstFit(_Static):
    """worst-fit (spread). Filter: the fit rules. Score: what the node has left after placing (the
    same measure as best-fit), so the emptiest node wins. Pick on the node: the GPU with the most
    free compute."""

    name = "worst-fit"

    def score(self, cluster: PackingCluster, state: NodeState, request: PackRequest, options: list[Option]) -> Scored:
        option = options[0]
        return Scored((_left_after(cluster, state, request), _gpu_left(state, request, option)), option)


class DotProduct(_Static):
    """dot-product (Tetris, SIGCOMM'14). Filter: the fit rules. Score: the alignment of the request
    with the node's free resources, sum over CPU, memory and GPU of (request / node capacity) x
    (free / node capacity); the best-aligned node wins. Pick on the node: the tightest GPU."""

    name = "dot-product"

    def score(self, cluster: PackingCluster, state: NodeState, request: PackRequest, options: list[Option]) -> Scored:
        shape = cluster.shapes[state.shape]
        dot = 0.0
        if shape.cpu_milli:
            dot += request.cpu_milli * state.cpu_free / (shape.cpu_milli * shape.cpu_milli)
        if shape.memory_mib:
            dot += request.memory_mib * state.mem_free / (shape.memory_mib * shape.memory_mib)
        if shape.gpus:
            cap = WHOLE * shape.gpus
            dot += request.gpu_demand_milli * _free_milli(state) / (cap * cap)
        left, option = _tightest(state, request, options)
        return Scored((dot, -left), option)


class Fgd:
    """fgd: Fragmentation Gradient Descent (Weng et al., USENIX ATC'23).

    Learns the workload mix online (`WorkloadMix`: the last `window` requests). Filter: the fit
    rules. Score: minus the growth of the node's expected fragmentation F_n(M) (see
    `fragmentation`) if the request is placed there, F measured with the paper's rules (a type
    fits by GPU, CPU and GPU model; host memory is not looked at). Pick on the node: the option
    whose placement grows F least (the first of equals). The version is the mix's: scores change
    when the mix is refreshed.
    """

    name = "fgd"
    memory_aware = False
    mig_aware = False
    host_weight = 0.0

    def __init__(self, mix: WorkloadMix | None = None) -> None:
        self.mix = mix if mix is not None else WorkloadMix()
        self._model: FragModel | None = None
        self._model_version = -1
        self._cluster: PackingCluster | None = None

    def observe(self, request: PackRequest) -> None:
        self.mix.observe(request)

    def version(self) -> int:
        return self.mix.version

    def model(self, cluster: PackingCluster) -> FragModel:
        """The fragmentation model for the current mix (rebuilt when the mix is refreshed)."""
        if self._model is None or self._model_version != self.mix.version or self._cluster is not cluster:
            self._model = FragModel(
                cluster,
                self.mix.types(),
                memory_aware=self.memory_aware,
                mig_aware=self.mig_aware,
                host_weight=self.host_weight,
            )
            self._model_version = self.mix.version
            self._cluster = cluster
        return self._model

    def deltas(
        self, cluster: PackingCluster, state: NodeState, request: PackRequest, options: list[Option]
    ) -> list[tuple[int, Option, NodeState]]:
        """(growth of F x W, option, state after) for every option."""
        model = self.model(cluster)
        before = model.frag(state)
        out = []
        for o in options:
            after = after_state(cluster, state, request, o)
            out.append((model.frag(after) - before, o, after))
        return out

    def score(self, cluster: PackingCluster, state: NodeState, request: PackRequest, options: list[Option]) -> Scored:
        best: tuple[int, Option] | None = None
        for d, o, _ in self.deltas(cluster, state, request, options):
            if best is None or d < best[0]:
                best = (d, o)
        assert best is not None
        return Scored((-best[0],), best[1])


class FgdPlus(Fgd):
    """fgd+: FGD whose fragments also see the host's CPU and memory and MIG layouts; ties broken.

    Learns the workload mix as fgd. Filter: the fit rules. Score, compared in order:
    1. minus the growth of expected fragmentation with `memory_aware`, `mig_aware` and
       `host_weight` = 1/2 (see `fragmentation`): a type also fails to fit when host memory is
       short, a MIG profile counts the instances that still fit the layout, and half of a
       GPU-sharing type's fragment is measured with its usable GPU capped by how many more such
       tasks the host's CPU and memory can take (GPU stranded by the host);
    2. best-fit's measure (least CPU + GPU left after placing), so among equal growths the fuller
       node is used and emptier ones stay whole;
    3. the tightest GPU.
    Pick on the node: the option growing fragmentation least, then the tightest GPU.
    """

    name = "fgd+"
    memory_aware = True
    mig_aware = True
    host_weight = 0.5
    tie_break = True

    def __init__(
        self,
        mix: WorkloadMix | None = None,
        *,
        memory_aware: bool = True,
        host_weight: float = 0.5,
        mig_aware: bool = True,
        tie_break: bool = True,
    ) -> None:
        """The keywords switch single extensions off or change the host weight (ablations)."""
        super().__init__(mix)
        self.memory_aware = memory_aware
        self.host_weight = host_weight
        self.mig_aware = mig_aware
        self.tie_break = tie_break

    def score(self, cluster: PackingCluster, state: NodeState, request: PackRequest, options: list[Option]) -> Scored:
        best: tuple[tuple[int, int], Option] | None = None
        for d, o, _ in self.deltas(cluster, state, request, options):
            key = (d, _gpu_left(state, request, o) if self.tie_break else 0)
            if best is None or key < best[0]:
                best = (key, o)
        assert best is not None
        (growth, left), option = best
        if not self.tie_break:
            return Scored((-growth,), option)
        return Scored((-growth, -_left_after(cluster, state, request), -left), option)


POLICIES: dict[str, Callable[[], ScorePlugin]] = {
    "first-fit": FirstFit,
    "best-fit": BestFit,
    "worst-fit": WorstFit,
    "dot-product": DotProduct,
    "fgd": Fgd,
    "fgd+": FgdPlus,
}


def register(name: str, factory: Callable[[], ScorePlugin]) -> None:
    """Add a policy to the registry (a name already taken is an error)."""
    if name in POLICIES:
        raise ValueError(f"policy {name!r} is already registered")
    POLICIES[name] = factory


def make_policy(name: str) -> ScorePlugin:
    try:
        return POLICIES[name]()
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}") from None
