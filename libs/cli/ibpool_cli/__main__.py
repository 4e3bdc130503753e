"""The `ibpool` command: `ibpool dev up|down|status`, `ibpool run`, `ibpool topo` (topo.py), `ibpool bench pack`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ibpool_runtime import devstack
from ibpool_runtime.bus import redact_url

from . import autoscale_sim

DEFAULT_STATE = Path(".ibpool/dev")


def _dev(args: argparse.Namespace) -> int:
    state = Path(args.state_dir)
    try:
        if args.action == "up":
            info = devstack.up(state, sync_always=not args.default_fsync, secure=not args.insecure)
            print(f"nats      {info.nats_url}  (monitor {info.nats_monitor_url}, pid {info.nats_pid})")
            print(f"postgres  {redact_url(info.postgres_dsn)}  (pid {info.postgres_pid})")
            if info.secured:
                print(f"secrets   {info.secrets_dir}  (a NATS user per service and admin, API tokens, Postgres)")
                import asyncio

                from .streams import ensure_streams

                # The services may not create streams on a secured stack: the admin makes them now.
                asyncio.run(ensure_streams(devstack.nats_url_as(info, "admin")))
            print(
                f"env file  {Path(info.state_dir) / devstack.ENV_FILE}"
                "  (services read IBPOOL_NATS_URL, IBPOOL_POSTGRES_DSN"
                + (", and each its own IBPOOL_<SERVICE>_NATS_URL and API tokens file)" if info.secured else ")")
            )
        elif args.action == "down":
            print("stopped" if devstack.down(state) else f"nothing running for {state}")
        else:
            for k, v in devstack.status(state).items():
                print(f"{k:<14} {v}")
    except devstack.StackError as e:
        print(f"ibpool dev {args.action}: {e}", file=sys.stderr)
        return 1
    return 0


# The operator's verbs (ops.py), listed here so that `ibpool --help` names them without importing it.
OPS_VERBS = {
    "nodes": "every node: state, health, free GPUs, models, its jobs",
    "node": "one node: its GPUs, their jobs and health, its verdicts",
    "allocations": "live allocations: GPUs granted to jobs",
    "quota": "quotas: get, set, delete",
    "events": "the bus's events, and with --follow each new one",
    "jobs": "jobs with where they run or why they wait",
    "job": "one job: show or cancel",
    "submit": "submit a job from flags or a job file",
    "usage": "GPU-hours by tenant and queue over a window",
    "cordon": "no new work on a node or GPU; its work stays",
    "uncordon": "lift an operator's cordon",
    "drain": "drain a node: cordon it and requeue its work",
    "resume": "put back a drained, cordoned or failed node or GPU",
    "recover": "the same as resume",
}


# The other commands, for the shell completion.
TOP_LEVEL = ("dev", "run", "topo", "predict", "sim", "services", "streams", "bench", "autoscale-sim", "completion")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["topo"]:  # its own parser: usage errors exit 1, input errors 2 (docs/fabric-cli.md)
        from .topo import main as topo_main

        return topo_main(argv[1:])
    if argv[:1] == ["sim"]:  # scheduling policies on job traces (docs/scheduling.md)
        from .sim import main as sim_main

        return sim_main(argv[1:])
    if argv[:2] == ["bench", "pack"]:  # the packing benchmark on pod and node lists (docs/packing.md)
        from ibpool_sim.pack_bench import main as pack_main

        return pack_main(argv[2:])
    if argv[:1] == ["streams"]:  # creating the JetStream streams as the admin (deploy/README.md)
        from .streams import main as streams_main

        return streams_main(argv[1:])
    if argv[:1] == ["services"]:  # every running instance, from the NATS service API
        from .services import main as services_main

        return services_main(argv[1:])
    if argv[:2] == ["completion", "bash"]:  # source <(ibpool completion bash)
        from .ops import completion

        print(completion([*TOP_LEVEL, *OPS_VERBS]), end="")
        return 0
    if argv[:1] and argv[0] in OPS_VERBS:  # the operator's verbs against a running system (ops.py)
        from .ops import main as ops_main

        return ops_main(argv[0], argv[1:])
    if argv[:1] == ["predict"]:  # runtime prediction on traces (docs/prediction.md)
        from .predict import main as predict_main

        return predict_main(argv[1:])
    p = argparse.ArgumentParser(prog="ibpool", description="ibpool: the control plane of InfiniBand GPU clusters")
    sub = p.add_subparsers(dest="command", required=True)

    dev = sub.add_parser("dev", help="the embedded stack: nats-server and PostgreSQL from wheels")
    dev.add_argument("action", choices=["up", "down", "status"])
    dev.add_argument("--state-dir", default=str(DEFAULT_STATE))
    dev.add_argument(
        "--default-fsync", action="store_true", help="JetStream default fsync instead of sync_interval: always"
    )
    dev.add_argument(
        "--insecure",
        action="store_true",
        help="an open stack for experiments: no NATS users, no API tokens, Postgres without a password",
    )

    run = sub.add_parser("run", help="the main job: stack, services, simulated cluster, live view")
    run.add_argument("--nodes", type=int, default=16)
    run.add_argument("--duration", type=float, default=60.0, help="seconds the finite scenario runs")
    run.add_argument("--serve", action="store_true", help="keep the system up until Ctrl-C")
    run.add_argument(
        "--measure",
        metavar="FILE",
        help="write what the run cost to FILE (JSON: CPU and peak memory per process, events per second, "
        "stream and Postgres growth, cycle and queue times; see docs/scale.md)",
    )
    run.add_argument("--seed", type=int, default=42)
    run.add_argument(
        "--slurm",
        action="store_true",
        help="also a throw-away Slurm beside it (Debian's slurmctld, slurmd and munge; root): the Slurm bridge "
        "writes its topology.conf from the fabric and drains the node whose agent is killed (docs/slurm.md)",
    )
    run.add_argument("--state-dir", default=None, help="default: a fresh folder under .ibpool/")
    run.add_argument(
        "--insecure",
        action="store_true",
        help="an open stack for experiments: no NATS users, no API tokens, Postgres without a password",
    )

    sub.add_parser("topo", help="fabric topologies: convert, show, diff, generate (ibpool topo --help)")
    sub.add_parser("predict", help="runtime prediction on traces: `ibpool predict eval --help`")
    sub.add_parser("sim", help="scheduling policies on job traces and fabrics (ibpool sim --help)")
    sub.add_parser("services", help="every running service instance, found from the bus (ibpool services --help)")
    sub.add_parser("completion", help="bash completion: source <(ibpool completion bash)").add_argument(
        "shell", choices=["bash"]
    )
    for verb, what in OPS_VERBS.items():
        sub.add_parser(verb, help=f"{what} (ibpool {verb} --help)")
    sub.add_parser("streams", help="create or update the JetStream streams as the admin (ibpool streams --help)")
    bench = sub.add_parser("bench", help="benchmarks: `ibpool bench pack --help` (GPU packing policies)")
    bench.add_argument("which", choices=["pack"])
    autoscale_sim.add_parser(sub)

    args = p.parse_args(argv)
    if args.command == "dev":
        return _dev(args)
    if args.command == "autoscale-sim":
        return autoscale_sim.main(args)
    from .run import run_main

    return run_main(args)


if __name__ == "__main__":
    sys.exit(main())
