"""`data-locality`: the job's dataset, from the dataset registry (`ClusterView.dataset_hosts`:
dataset -> hosts holding a copy, merged with each host's own `datasets`).

One plugin at three points:
  PreFilter  locality "required": only the holders are candidates; no holder at all rejects the ask
  Filter     locality "required": a host that holds no copy is out (kept for profiles without
             the PreFilter)
  HostScore  100 for a holder, 0 otherwise when the job names a dataset with locality "preferred";
             100 for every host when there is nothing to prefer (a constant does not change the choice)
Contract: reads the ask and `view.dataset_hosts` only; never changes the view.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..framework import ClusterView, HostState, PlacementAsk, PreFilterResult
from .args import numeric_args


class DataLocality:
    host_local = True  # Filter and HostScore read the ask and `view.dataset_hosts` only

    def pre_filter(self, ask: PlacementAsk, view: ClusterView) -> PreFilterResult:
        if ask.dataset is None or ask.data_locality != "required":
            return PreFilterResult()
        holders = view.dataset_hosts.get(ask.dataset, frozenset())
        if not holders:
            return PreFilterResult(reject=f"no host holds dataset {ask.dataset!r}")
        return PreFilterResult(hosts=holders)

    def filter(self, ask: PlacementAsk, view: ClusterView, host: HostState) -> str | None:
        if ask.dataset is None or ask.data_locality != "required":
            return None
        if host.name in view.dataset_hosts.get(ask.dataset, ()):
            return None
        return "does not hold the dataset"

    def score_host(self, ask: PlacementAsk, view: ClusterView, host: HostState) -> float:
        if ask.dataset is None or ask.data_locality != "preferred":
            return 100.0
        return 100.0 if host.name in view.dataset_hosts.get(ask.dataset, ()) else 0.0


def make_data_locality(args: Mapping[str, Any]) -> DataLocality:
    numeric_args(args, {})
    return DataLocality()
