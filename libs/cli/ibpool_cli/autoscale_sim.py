"""`ibpool autoscale-sim`: reactive vs predictive autoscaling on a replayed diurnal trace with a burst.

    ibpool autoscale-sim [--policy reactive,predictive] [--seed N[,N...] | --seeds N]
                         [--format json|table] [--plot FILE.png]

The simulator, its trace generator and queue model are `ibpool_sim.inference_sim` (docs/autoscaling.md).
Meant to move under `ibpool sim autoscale` once that command group exists.
"""

from __future__ import annotations

import argparse
from typing import Any


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register `autoscale-sim` on the `ibpool` subparsers."""
    from ibpool_sim.inference_sim import add_arguments

    p: argparse.ArgumentParser = subparsers.add_parser(
        "autoscale-sim",
        help="autoscaling policies on a diurnal trace with a burst: SLO violations and GPU-hours",
        description="Replays a seeded diurnal request-rate trace with a burst through the autoscaler's decide() "
        "and reports SLO violation minutes and GPU-hours per policy and seed (docs/autoscaling.md).",
    )
    add_arguments(p)
    return p


def main(args: argparse.Namespace) -> int:
    from ibpool_sim.inference_sim import run_from_args

    return run_from_args(args)
