"""Dashboard configuration (env `IBPOOL_DASHBOARD_<FIELD>` or TOML `[dashboard]`).

The dashboard keeps no state: the bus and the services' APIs are all it reads (`postgres_dsn` is
not used). Its NATS user (a secured stack's `dashboard`) reads the streams and the heartbeats, asks the
NATS service API for the services' URLs and answers it (`register`), so `ibpool services` lists it.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from ibpool_runtime.config import BaseConfig, Positive


class DashboardConfig(BaseConfig, frozen=True, kw_only=True):
    # The bearer token the dashboard reads the services' APIs with (needed only where they protect
    # reads); actions are sent with the operator's own token, never this one.
    services_token: str = ""
    # Answer the NATS service API, so `ibpool services` lists the dashboard (its user must be allowed to).
    register: bool = True
    # How often the services are looked for on the bus, and how long each ask waits for answers.
    discover_interval_s: Positive = 3.0
    discover_wait_s: Positive = 1.0
    # How often a point of the overview's history is taken (and sent to browsers as a `tick`).
    sample_interval_s: Positive = 2.0
    history_points: Annotated[int, msgspec.Meta(ge=1)] = 900
    # Events kept for new pages, and how far back in each stream the dashboard starts reading.
    recent_events: Annotated[int, msgspec.Meta(ge=1)] = 1000
    backlog_events: Annotated[int, msgspec.Meta(ge=0)] = 5000
    # With API tokens, only operators may call the actions (cordon, drain, recover, cancel).
    api_operator_paths: str = "/api/actions"
