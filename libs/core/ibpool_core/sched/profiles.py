"""The placement profile the scheduler service and the simulator both run (`framework.build_profile`).

One definition, so a policy measured in the simulator is placed by the same plugins with the same
weights as in the service. No Reserve or Permit plugins: the scheduling cycle holds the GPUs it
gives and keeps a gang whole itself (`framework_placer.FrameworkPlacer`). The service's config may
override fields (`placement_profile`), merged over this one.
"""

from __future__ import annotations

from typing import Any

SCHEDULER_PROFILE: dict[str, Any] = {
    "name": "scheduler",
    "pre_filter": [{"name": "data-locality"}],
    "filter": [{"name": "fits"}, {"name": "health"}, {"name": "gpu-model"}, {"name": "data-locality"}],
    "score": [
        {"name": "topology", "weight": 10},
        {"name": "load", "weight": 6},
        {"name": "data-locality", "weight": 6},
        {"name": "link-health", "weight": 3},
        {"name": "binpack", "weight": 1},
    ],
    "reserve": [],
    "permit": [],
}
