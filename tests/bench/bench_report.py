"""The table every benchmark prints: the median of its runs per measure, the floor, the verdict, each run."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

Row = tuple[str, str, str | None]
"""(label, key in a run's figures, key of its floor or None)."""


def print_medians(
    rows: Sequence[Row],
    runs: Sequence[Mapping[str, Any]],
    median: Mapping[str, float],
    verdict: Mapping[str, bool],
    floors: Mapping[str, float],
    width: int = 10,
) -> None:
    print(f"{'measure':<28}{'median':>{width}}{'floor':>10}  verdict   runs")
    for label, key, floor_key in rows:
        floor = floors.get(floor_key) if floor_key else None
        mark = ("pass" if verdict[floor_key] else "FAIL") if floor_key else ""
        raw = " ".join(f"{r[key]:.3g}" for r in runs)
        print(f"{label:<28}{median[key]:>{width}.3f}{(f'< {floor:g}' if floor else ''):>10}  {mark:<8}  {raw}")
