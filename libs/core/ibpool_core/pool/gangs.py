"""Gangs: the same request on N distinct hosts, all or nothing, under as few fabric leaves as possible.

`place_gang(cluster, policy, request, hosts)` filters the nodes with the fit rules, scores each with
the policy (one member per host, so the members do not interact), and then chooses the hosts:

1. if some leaf has at least `hosts` nodes that fit, the gang goes under one leaf: the leaf with
   the *fewest* fitting nodes that still holds it (best fit at leaf level, so the leaves with more
   room stay whole for later and larger gangs); ties go to the leaf whose chosen hosts score
   best, then to the lowest node index. Inside the leaf the best-scored hosts are taken;
2. otherwise it spans the fewest leaves: the leaves with the most fitting nodes first, and for the
   last part the smallest leaf that completes it.

Nodes whose leaf is unknown ("") count as one leaf of their own kind, so a fabric-less cluster
behaves as one leaf. `choose_gang` only decides; `place_gang` also takes the hosts, or nothing
(None) when fewer than `hosts` nodes fit.
"""

from __future__ import annotations

from .packing import Option, PackingCluster, PackingError, PackRequest, Placement, Score, ScorePlugin, fit_options


def _scored_nodes(
    cluster: PackingCluster, policy: ScorePlugin, request: PackRequest
) -> dict[str, list[tuple[Score, int, Option]]]:
    """Per leaf, the fitting nodes as (score, node, option), best first (ties: lowest node)."""
    cache: dict[object, tuple[Score, Option] | None] = {}
    by_leaf: dict[str, list[tuple[Score, int, Option]]] = {}
    for n in range(len(cluster)):
        st = cluster.state(n)
        if st not in cache:
            opts = fit_options(cluster, st, request)
            s = policy.score(cluster, st, request, opts) if opts else None
            cache[st] = None if s is None else (s.score, s.option)
        hit = cache[st]
        if hit is not None:
            by_leaf.setdefault(cluster.shapes[st.shape].leaf, []).append((hit[0], n, hit[1]))
    for nodes in by_leaf.values():
        nodes.sort(key=lambda x: (tuple(-v for v in x[0]), x[1]))
    return by_leaf


def choose_gang(
    cluster: PackingCluster, policy: ScorePlugin, request: PackRequest, hosts: int
) -> list[tuple[int, Option]] | None:
    """The hosts and options for a gang (see the module docstring); nothing is taken."""
    if hosts < 1:
        raise PackingError(f"a gang has at least one host, got {hosts}")
    by_leaf = _scored_nodes(cluster, policy, request)
    if sum(len(v) for v in by_leaf.values()) < hosts:
        return None
    whole = [leaf for leaf, nodes in by_leaf.items() if len(nodes) >= hosts]
    if whole:

        def leaf_key(leaf: str) -> tuple[int, tuple[float, ...], int]:
            top = by_leaf[leaf][:hosts]
            total = tuple(-sum(x[0][i] for x in top) for i in range(len(top[0][0])))
            return (len(by_leaf[leaf]), total, min(x[1] for x in top))

        best = min(whole, key=leaf_key)
        return [(n, o) for _, n, o in by_leaf[best][:hosts]]
    chosen: list[tuple[int, Option]] = []
    leaves = sorted(by_leaf, key=lambda leaf: (-len(by_leaf[leaf]), min(x[1] for x in by_leaf[leaf])))
    while len(chosen) < hosts:
        need = hosts - len(chosen)
        completing = [leaf for leaf in leaves if len(by_leaf[leaf]) >= need]
        leaf = min(completing, key=lambda lf: len(by_leaf[lf])) if completing else leaves[0]
        leaves.remove(leaf)
        chosen.extend((n, o) for _, n, o in by_leaf[leaf][:need])
    return chosen


def place_gang(
    cluster: PackingCluster, policy: ScorePlugin, request: PackRequest, hosts: int
) -> list[Placement] | None:
    """Observe the request once, choose the gang's hosts (`choose_gang`) and take them all, or
    nothing (None) when the gang does not fit."""
    policy.observe(request)
    chosen = choose_gang(cluster, policy, request, hosts)
    if chosen is None:
        return None
    done: list[Placement] = []
    try:
        for n, o in chosen:
            done.append(cluster.allocate(n, request, o))
    except PackingError:
        for p in done:
            cluster.release(p, request)
        raise
    return done
