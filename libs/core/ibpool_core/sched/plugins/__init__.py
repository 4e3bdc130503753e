"""The built-in placement plugins and the registry that names them.

name            points                          module
fits            Filter                          filters
health          Filter                          filters
gpu-model       Filter                          filters
data-locality   PreFilter, Filter, HostScore    data_locality
topology        GangScore                       scores
load            HostScore                       scores
link-health     HostScore, Filter               scores
binpack         HostScore                       scores
gpus            Reserve                         gang
gang-barrier    Permit                          gang
"""

from __future__ import annotations

from ..framework import Registry
from .data_locality import make_data_locality
from .filters import make_fits, make_gpu_model, make_health
from .gang import make_gang_barrier, make_reserve_gpus
from .scores import make_binpack, make_link_health, make_load, make_topology


def default_registry() -> Registry:
    """A new registry holding every built-in plugin (add your own with `register`)."""
    registry = Registry()
    registry.register("fits", make_fits)
    registry.register("health", make_health)
    registry.register("gpu-model", make_gpu_model)
    registry.register("data-locality", make_data_locality)
    registry.register("topology", make_topology)
    registry.register("load", make_load)
    registry.register("link-health", make_link_health)
    registry.register("binpack", make_binpack)
    registry.register("gpus", make_reserve_gpus)
    registry.register("gang-barrier", make_gang_barrier)
    return registry
