"""`ibpool predict eval`: the runtime predictor against the naive per-tenant median, replayed in time order.

    ibpool predict eval --trace philly [--path CSV] [--limit N] [--retrain-every N] [--max-train-rows N]
                        [--format table|json]

The method and the figures are in docs/prediction.md. Exit 0 on success, 1 on a usage error,
2 when the trace cannot be read.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import msgspec
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn
from rich.table import Table

from ibpool_predict.estimator import EstimatorConfig
from ibpool_predict.evaluate import EvalReport, evaluate_in_time_order, load_philly_jobs
from ibpool_predict.model import BoostParams
from ibpool_sim import shared_data
from ibpool_sim.traces import TraceError

PHILLY = "traces/philly/philly.csv"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(1)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="ibpool predict", description="runtime prediction learned from finished jobs")
    sub = p.add_subparsers(dest="action", required=True, parser_class=_Parser)
    ev = sub.add_parser("eval", help="replay a trace in submit order; learned vs naive per-tenant median")
    ev.add_argument("--trace", choices=["philly"], default="philly")
    ev.add_argument("--path", type=Path, default=None, help="the trace CSV (default: the shared data folder's)")
    ev.add_argument("--limit", type=int, default=None, help="only the first N jobs in submit order")
    ev.add_argument("--retrain-every", type=int, default=4_000, help="finished jobs between two trainings")
    ev.add_argument("--max-train-rows", type=int, default=20_000, help="rows one training sees (sampled)")
    ev.add_argument("--max-iter", type=int, default=BoostParams().max_iter, help="boosting rounds per quantile")
    ev.add_argument("--format", choices=["table", "json"], default="table")
    return p


def _print_table(report: EvalReport) -> None:
    console = Console()
    for title, scores in (
        ("all jobs", report.overall),
        ("jobs submitted once a model served", report.after_first_model),
    ):
        if not scores:
            continue
        table = Table(title=f"{report.trace}: {title} ({scores[0].jobs:,} jobs)")
        for column in ("method", "MAE (s)", "within 2x", "p90 coverage"):
            table.add_column(column, justify="left" if column == "method" else "right")
        for s in scores:
            table.add_row(s.method, f"{s.mae_s:,.0f}", f"{s.within_2x:.1%}", f"{s.p90_coverage:.1%}")
        console.print(table)
    console.print(
        f"{report.models_trained} models trained (every {report.retrain_every:,} finished jobs, "
        f"at most {report.max_train_rows:,} rows each); {report.seconds:.1f} s in all, "
        f"{report.seconds_training:.1f} s training"
    )


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    if (args.limit is not None and args.limit <= 0) or args.retrain_every <= 0 or args.max_train_rows <= 0:
        print("ibpool predict eval: --limit, --retrain-every and --max-train-rows must be positive", file=sys.stderr)
        return 1
    path = args.path or shared_data.locate(PHILLY)
    if path is None:
        print(f"ibpool predict eval: {PHILLY} not found under {shared_data.shared_data_dir()}", file=sys.stderr)
        return 2
    try:
        jobs = load_philly_jobs(path)
    except (OSError, TraceError) as e:
        print(f"ibpool predict eval: {e}", file=sys.stderr)
        return 2
    jobs.sort(key=lambda j: j.job.submit_time)
    if args.limit is not None:
        jobs = jobs[: args.limit]
    config = EstimatorConfig(max_train_rows=args.max_train_rows)
    params = BoostParams(max_iter=args.max_iter)
    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as bar:
        task = bar.add_task(f"replaying {args.trace}", total=len(jobs))
        report = evaluate_in_time_order(
            jobs,
            trace=args.trace,
            retrain_every=args.retrain_every,
            config=config,
            params=params,
            progress=lambda done, total: bar.update(task, completed=done),
        )
    if args.format == "json":
        print(msgspec.json.format(msgspec.json.encode(report)).decode())
    else:
        _print_table(report)
    return 0
