"""decide() checked against itself, the way the failover controller calls it.

Every decision is made twice, with the caller's `Watch` and without, and must give the same reply
byte for byte; and the state kept entry by entry through the replies' `StateChanges` (as the
controller's store keeps it) must equal the reply's state but for the heartbeat and telemetry times,
which are not kept (`restart_grace` gives every node a fresh window).
"""

from __future__ import annotations

from typing import Any

import msgspec

from ibpool_core.health.decide import STATE_MAPS, FailoverReply, FailoverRequest, HealthState, NodeHealth, Watch, decide


def _untimed(n: NodeHealth) -> NodeHealth:
    beat = None if n.last_beat is None else n.last_beat.min
    return msgspec.structs.replace(n, last_beat=beat, telemetry_at=None)


def _maps(state: HealthState) -> dict[str, dict[Any, Any]]:
    return {name: dict(getattr(state, name)) for name in STATE_MAPS}


class Twin:
    def __init__(self) -> None:
        self.watch = Watch()
        self.last: HealthState | None = None
        self.kept: dict[str, dict[Any, Any]] = {}
        self.scalars = (False, 0)

    def decide(self, request: FailoverRequest) -> FailoverReply:
        if request.state is not self.last:
            # A state from elsewhere (the first, a restart's, a new topology): the store writes it whole.
            self.kept = _maps(request.state)
            self.scalars = (request.state.degraded, request.state.topology_version)
        plain = decide(request)
        watched = decide(request, self.watch)
        assert msgspec.json.encode(watched) == msgspec.json.encode(plain), "a watch changed the decision"
        self.keep(watched)
        return watched

    def keep(self, reply: FailoverReply) -> None:
        state, changes = reply.state, reply.changes
        for name in STATE_MAPS:
            live, kept = getattr(state, name), self.kept[name]
            for key in getattr(changes, name):
                if key in live:
                    kept[key] = live[key]
                else:
                    kept.pop(key, None)
        if changes.scalars:
            self.scalars = (state.degraded, state.topology_version)
        self.last = state
        nodes = {k: _untimed(n) for k, n in state.nodes.items()}
        assert {k: _untimed(n) for k, n in self.kept["nodes"].items()} == nodes, "a node change was not reported"
        for name in STATE_MAPS[1:]:
            assert self.kept[name] == dict(getattr(state, name)), f"a change of {name} was not reported"
        assert self.scalars == (state.degraded, state.topology_version), "a scalar change was not reported"
