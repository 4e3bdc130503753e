"""Replays a diurnal request-rate trace with a burst through the autoscaler's `decide()`.

The trace (`generate_trace`, seeded, `TraceConfig`): `days` days at `step_s` (60 s) resolution.

    shape(h)  = ((1 - cos(2 pi (h - trough_hour) / 24)) / 2) ** sharpness      (0 at the trough, 1 at
                                                                                 trough_hour + 12)
    rate(t)   = (trough + (peak - trough) * shape(h)) * day_factor(d) * exp(noise(t)) * burst(t)
    noise     = AR(1) on the log rate: n(t) = phi * n(t-1) + sigma * sqrt(1 - phi^2) * N(0, 1)
    day_factor= 1 + day_jitter * U(-1, 1), one draw per day
    burst(t)  = on day `burst_day` only, starting at a uniform time between 10:00 and 18:00: a linear
                rise to `burst_multiplier` over `burst_rise_s`, held `burst_hold_s`, a linear decay
                over `burst_decay_s`; 1 elsewhere.

Arrivals in each control interval are Poisson(rate * interval) (normal approximation above 50).

The queue model (`QueueConfig`), per control interval of `control_interval_s`, with c = ready
replicas x `concurrency` servers, each serving `capacity_rps / concurrency` requests/s:

- Fluid backlog: B' = max(0, B + arrivals - c * server_rate * interval). While B or B' > 0 the
  queue is over capacity and a request waits max(B, B') / (c * server_rate) seconds.
- Otherwise M/M/c: P(wait > t) = ErlangC(c, a) * exp(-(c * server_rate - rate) * t), so the p99 wait
  is ln(ErlangC / 0.01) / (c * server_rate - rate) when ErlangC > 1%, else 0.
- p99 latency = `service_p99_s` (the model's own p99 time per request) + the p99 wait. With no
  ready replica and traffic, the latency is infinite.

A minute is an SLO violation when the p99 latency of any control interval in it exceeds
`slo_p99_s`. GPU-hours count every replica from its start (starting replicas hold their GPUs while
they load) to its removal. A replica started at t serves from t + `cold_start_s`.

Every control interval the simulator hands `ibpool_core.scale.decide` the deployment, its replicas,
the last `history_s` of samples (requests/s, queue length, GPU utilisation, p99 latency of each
interval) and the memory from the previous reply, and applies the reply at once (starts `add`
replicas, stops the ids in `remove`).

    python -m ibpool_sim.inference_sim --policy reactive,predictive --seeds 5 --format table
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import random
import sys
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

from ibpool_core.scale.model import (
    Deployment,
    MetricSample,
    MetricTarget,
    PolicyConfig,
    Replica,
    ReplicaShape,
    ReplicaState,
    ScalerMemory,
    ScalingRequest,
)
from ibpool_core.scale.policies import POLICIES, decide

START = dt.datetime(2026, 1, 5, tzinfo=dt.UTC)  # a Monday, 00:00 UTC: hour of day = hour of the trace


class TraceConfig(msgspec.Struct, frozen=True, kw_only=True):
    days: int = 3
    step_s: float = 60.0
    trough_rps: float = 60.0
    peak_rps: float = 600.0
    trough_hour: float = 4.0
    sharpness: float = 1.5
    noise_sigma: float = 0.06
    noise_phi: float = 0.9
    day_jitter: float = 0.05
    # 0-based day of the burst (2 = the third day); -1 for none
    burst_day: int = 2
    burst_multiplier: float = 2.0
    burst_rise_s: float = 180.0
    burst_hold_s: float = 1200.0
    burst_decay_s: float = 600.0


class QueueConfig(msgspec.Struct, frozen=True, kw_only=True):
    capacity_rps: float = 10.0
    concurrency: int = 8
    service_p99_s: float = 1.0
    slo_p99_s: float = 2.0


class SimConfig(msgspec.Struct, frozen=True, kw_only=True):
    trace: TraceConfig = TraceConfig()
    queue: QueueConfig = QueueConfig()
    deployment: Deployment = Deployment(
        name="chat",
        min_replicas=1,
        max_replicas=160,
        shape=ReplicaShape(gpus=1),
        targets=[MetricTarget(metric="requests_per_s", value=8.0)],
        cold_start_s=180.0,
    )
    control_interval_s: float = 15.0
    history_s: float = 900.0
    # The knobs of both policies (the name is set per run).
    policy: PolicyConfig = PolicyConfig()


DEFAULT_TRACE = TraceConfig()
DEFAULT_SIM = SimConfig()


class Trace(msgspec.Struct, frozen=True, kw_only=True):
    step_s: float
    rates: list[float]
    burst_start_s: float | None


class RunResult(msgspec.Struct, frozen=True, kw_only=True):
    policy: str
    seed: int
    slo_violation_minutes: int
    gpu_hours: float
    minutes: int
    mean_replicas: float
    max_replicas: int
    scale_ups: int
    scale_downs: int
    # violations inside the burst window (burst start to its end + 30 min)
    burst_violation_minutes: int
    # per minute, for plots: the arrival rate, replicas held (ready + starting), ready, p99 latency
    series: dict[str, list[float]] = {}


def generate_trace(seed: int, cfg: TraceConfig = DEFAULT_TRACE) -> Trace:
    """The seeded diurnal trace with a burst described in the module docstring."""
    rng = random.Random(seed)
    steps = round(cfg.days * 86400 / cfg.step_s)
    day_factors = [1.0 + cfg.day_jitter * rng.uniform(-1.0, 1.0) for _ in range(cfg.days)]
    burst_start: float | None = None
    if 0 <= cfg.burst_day < cfg.days:
        burst_start = cfg.burst_day * 86400.0 + rng.uniform(10.0, 18.0) * 3600.0
    innovation = cfg.noise_sigma * math.sqrt(1.0 - cfg.noise_phi**2)
    noise = rng.gauss(0.0, cfg.noise_sigma)
    rates: list[float] = []
    for k in range(steps):
        t = k * cfg.step_s
        hour = (t % 86400.0) / 3600.0
        shape = ((1.0 - math.cos(2.0 * math.pi * (hour - cfg.trough_hour) / 24.0)) / 2.0) ** cfg.sharpness
        base = cfg.trough_rps + (cfg.peak_rps - cfg.trough_rps) * shape
        noise = cfg.noise_phi * noise + innovation * rng.gauss(0.0, 1.0)
        rate = base * day_factors[int(t // 86400.0)] * math.exp(noise)
        if burst_start is not None:
            rate *= burst_factor(t - burst_start, cfg)
        rates.append(rate)
    return Trace(step_s=cfg.step_s, rates=rates, burst_start_s=burst_start)


def burst_factor(since_start_s: float, cfg: TraceConfig) -> float:
    x = since_start_s
    extra = cfg.burst_multiplier - 1.0
    if x < 0 or x >= cfg.burst_rise_s + cfg.burst_hold_s + cfg.burst_decay_s:
        return 1.0
    if x < cfg.burst_rise_s:
        return 1.0 + extra * x / cfg.burst_rise_s
    if x < cfg.burst_rise_s + cfg.burst_hold_s:
        return 1.0 + extra
    return 1.0 + extra * (1.0 - (x - cfg.burst_rise_s - cfg.burst_hold_s) / cfg.burst_decay_s)


def poisson(rng: random.Random, mean: float) -> int:
    """A Poisson draw: Knuth's method for small means, the normal approximation above 50."""
    if mean <= 0:
        return 0
    if mean > 50:
        return max(0, round(rng.gauss(mean, math.sqrt(mean))))
    limit, k, p = math.exp(-mean), 0, 1.0
    while True:
        p *= rng.random()
        if p <= limit:
            return k
        k += 1


def erlang_c(servers: int, offered: float) -> float:
    """Probability that an arrival waits in an M/M/c queue (offered load in servers, < servers)."""
    b = 1.0
    for n in range(1, servers + 1):
        b = offered * b / (n + offered * b)
    rho = offered / servers
    return b / (1.0 - rho * (1.0 - b))


def p99_wait_s(servers: int, server_rate: float, rate: float) -> float:
    """The M/M/c p99 waiting time; infinite at or over capacity."""
    if rate <= 0:
        return 0.0
    if servers == 0 or rate >= servers * server_rate:
        return math.inf
    c = erlang_c(servers, rate / server_rate)
    if c <= 0.01:
        return 0.0
    return math.log(c / 0.01) / (servers * server_rate - rate)


class _Running:
    __slots__ = ("ready_at", "replica")

    def __init__(self, replica: Replica, ready_at: dt.datetime) -> None:
        self.replica = replica
        self.ready_at = ready_at


def simulate(policy: str, seed: int, cfg: SimConfig = DEFAULT_SIM, keep_series: bool = False) -> RunResult:
    """One run of one policy on the trace of `seed` (arrivals use the same seed, so policies see the
    same requests)."""
    trace = generate_trace(seed, cfg.trace)
    rng = random.Random(seed * 7919 + 1)
    q, dep = cfg.queue, cfg.deployment
    dt_s = cfg.control_interval_s
    per_step = round(trace.step_s / dt_s)
    if per_step < 1 or abs(per_step * dt_s - trace.step_s) > 1e-9:
        raise ValueError("the trace step must be a multiple of the control interval")
    server_rate = q.capacity_rps / q.concurrency
    policy_cfg = msgspec.structs.replace(cfg.policy, name=policy)
    memory = ScalerMemory()
    history: deque[MetricSample] = deque(maxlen=max(1, math.ceil(cfg.history_s / dt_s)) + 1)

    running: list[_Running] = []
    next_id = 0
    now = START
    # Warm start: as many ready replicas as the first minute's rate asks for at the target, so the
    # run does not begin with a cold-start violation no policy could avoid.
    target = dep.target_of("requests_per_s")
    warm = math.ceil(trace.rates[0] / target) if target else 1
    for _ in range(min(dep.max_replicas, max(dep.min_replicas, 1, warm))):
        running.append(_Running(Replica(replica_id=f"r{next_id}", state="ready", since=now), now))
        next_id += 1

    backlog = 0.0
    gpu_hours = 0.0
    violations = 0
    burst_violations = 0
    replica_seconds = 0.0
    max_held = 0
    ups = downs = 0
    series: dict[str, list[float]] = {"rate": [], "replicas": [], "ready": [], "p99_s": []}
    burst_lo = trace.burst_start_s
    burst_hi = None if burst_lo is None else burst_lo + _burst_length(cfg.trace) + 1800.0
    for minute, rate in enumerate(trace.rates):
        minute_worst = 0.0
        for _ in range(per_step):
            for r in running:
                if r.replica.state == "starting" and r.ready_at <= now:
                    r.replica = Replica(replica_id=r.replica.replica_id, state="ready", since=r.ready_at)
            ready = sum(1 for r in running if r.replica.state == "ready")
            held = len(running)
            arrivals = poisson(rng, rate * dt_s)
            servers = ready * q.concurrency
            served = servers * server_rate * dt_s
            after = max(0.0, backlog + arrivals - served)
            observed_rate = arrivals / dt_s
            if backlog > 0 or after > 0:
                wait = math.inf if servers == 0 else max(backlog, after) / (servers * server_rate)
            else:
                wait = p99_wait_s(servers, server_rate, observed_rate)
            p99 = q.service_p99_s + wait if arrivals or backlog else 0.0
            backlog = after
            minute_worst = max(minute_worst, p99)
            gpu_hours += held * dep.shape.gpu_equivalent * dt_s / 3600.0
            replica_seconds += held * dt_s
            max_held = max(max_held, held)

            now = now + dt.timedelta(seconds=dt_s)
            history.append(
                MetricSample(
                    at=now,
                    requests_per_s=observed_rate,
                    queue_length=backlog,
                    gpu_utilization=min(1.0, observed_rate / (servers * server_rate)) if servers else None,
                    p99_latency_s=p99 if math.isfinite(p99) else 3600.0,
                )
            )
            request = ScalingRequest(
                deployment=dep,
                replicas=[r.replica for r in running],
                metrics=list(history),
                now=now,
                policy=policy_cfg,
                memory=memory,
            )
            reply = decide(request)
            memory = reply.memory
            if reply.remove:
                gone = set(reply.remove)
                running = [r for r in running if r.replica.replica_id not in gone]
                downs += 1
            if reply.add:
                ups += 1
                ready_at = now + dt.timedelta(seconds=dep.cold_start_s)
                for _ in range(reply.add):
                    state: ReplicaState = "ready" if dep.cold_start_s <= 0 else "starting"
                    running.append(_Running(Replica(replica_id=f"r{next_id}", state=state, since=now), ready_at))
                    next_id += 1
        violated = minute_worst > q.slo_p99_s
        violations += violated
        t = minute * trace.step_s
        if violated and burst_lo is not None and burst_hi is not None and burst_lo <= t < burst_hi:
            burst_violations += 1
        if keep_series:
            series["rate"].append(rate)
            series["replicas"].append(float(len(running)))
            series["ready"].append(float(sum(1 for r in running if r.replica.state == "ready")))
            series["p99_s"].append(minute_worst if math.isfinite(minute_worst) else -1.0)
    total_s = len(trace.rates) * trace.step_s
    return RunResult(
        policy=policy,
        seed=seed,
        slo_violation_minutes=violations,
        gpu_hours=gpu_hours,
        minutes=len(trace.rates),
        mean_replicas=replica_seconds / total_s,
        max_replicas=max_held,
        scale_ups=ups,
        scale_downs=downs,
        burst_violation_minutes=burst_violations,
        series=series if keep_series else {},
    )


def _burst_length(cfg: TraceConfig) -> float:
    return cfg.burst_rise_s + cfg.burst_hold_s + cfg.burst_decay_s


def summarise(runs: Sequence[RunResult]) -> dict[str, Any]:
    """Per policy: the mean violation minutes and GPU-hours; predictive vs reactive and the floor."""
    by_policy: dict[str, list[RunResult]] = {}
    for r in runs:
        by_policy.setdefault(r.policy, []).append(r)
    out: dict[str, Any] = {"policies": {}}
    for name, rs in by_policy.items():
        out["policies"][name] = {
            "seeds": [r.seed for r in rs],
            "mean_slo_violation_minutes": sum(r.slo_violation_minutes for r in rs) / len(rs),
            "mean_burst_violation_minutes": sum(r.burst_violation_minutes for r in rs) / len(rs),
            "mean_gpu_hours": sum(r.gpu_hours for r in rs) / len(rs),
        }
    if "reactive" in by_policy and "predictive" in by_policy:
        rea, pre = out["policies"]["reactive"], out["policies"]["predictive"]
        ratio = pre["mean_gpu_hours"] / rea["mean_gpu_hours"] if rea["mean_gpu_hours"] else math.inf
        fewer = pre["mean_slo_violation_minutes"] < rea["mean_slo_violation_minutes"]
        out["floor"] = {
            "gpu_hours_ratio": ratio,
            "fewer_violations": fewer,
            "met": fewer and ratio <= 1.1,
            "seeds_fewer_violations": sum(
                1
                for a, b in zip(by_policy["reactive"], by_policy["predictive"], strict=True)
                if b.slo_violation_minutes < a.slo_violation_minutes
            ),
        }
    return out


def format_table(runs: Sequence[RunResult], summary: dict[str, Any]) -> str:
    lines = [
        f"{'policy':<11} {'seed':>4} {'SLO viol. min':>13} {'in burst':>8} {'GPU-hours':>10} "
        f"{'mean repl.':>10} {'max repl.':>9}"
    ]
    for r in sorted(runs, key=lambda r: (r.policy, r.seed)):
        lines.append(
            f"{r.policy:<11} {r.seed:>4} {r.slo_violation_minutes:>13} {r.burst_violation_minutes:>8} "
            f"{r.gpu_hours:>10.1f} {r.mean_replicas:>10.1f} {r.max_replicas:>9}"
        )
    for name, s in summary["policies"].items():
        lines.append(
            f"{name:<11} {'mean':>4} {s['mean_slo_violation_minutes']:>13.1f} "
            f"{s['mean_burst_violation_minutes']:>8.1f} {s['mean_gpu_hours']:>10.1f}"
        )
    if "floor" in summary:
        f = summary["floor"]
        seeds = len(summary["policies"]["reactive"]["seeds"])
        lines.append(
            f"floor (predictive fewer violations at <= 1.1x GPU-hours): "
            f"{'met' if f['met'] else 'NOT met'} (GPU-hours ratio {f['gpu_hours_ratio']:.3f}, "
            f"fewer violations on {f['seeds_fewer_violations']} of {seeds} seeds)"
        )
    return "\n".join(lines)


def plot(runs: Sequence[RunResult], path: Path) -> None:
    """Arrival rate and replicas held per policy, for the first seed that has series."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with_series = [r for r in runs if r.series]
    if not with_series:
        return
    seed = with_series[0].seed
    chosen = [r for r in with_series if r.seed == seed]
    fig, (ax_rate, ax_rep) = plt.subplots(2, 1, figsize=(12, 6), sharex=True)
    hours = [m / 60.0 for m in range(len(chosen[0].series["rate"]))]
    ax_rate.plot(hours, chosen[0].series["rate"], lw=0.6, color="black")
    ax_rate.set_ylabel("requests/s")
    ax_rate.set_title(f"diurnal trace with a burst (seed {seed})")
    for r in chosen:
        line = ax_rep.plot(
            hours, r.series["replicas"], lw=0.8, label=f"{r.policy} ({r.slo_violation_minutes} viol. min)"
        )
        bad = [h for h, p in zip(hours, r.series["p99_s"], strict=True) if p < 0 or p > 2.0]
        ax_rep.plot(bad, [0.0] * len(bad), "|", color=line[0].get_color(), ms=10)
    ax_rep.set_ylabel("replicas held (ticks: SLO violations)")
    ax_rep.set_xlabel("hours")
    ax_rep.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(
    policies: Sequence[str], seeds: Sequence[int], cfg: SimConfig = DEFAULT_SIM, want_series: bool = False
) -> list[RunResult]:
    for p in policies:
        if p not in POLICIES:
            raise ValueError(f"unknown policy {p!r}; known: {', '.join(sorted(POLICIES))}")
    return [simulate(p, s, cfg, keep_series=want_series and s == seeds[0]) for p in policies for s in seeds]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policy", default="reactive,predictive", help="policies, comma-separated")
    p.add_argument("--seed", default="0", help="seed(s), comma-separated (default 0)")
    p.add_argument("--seeds", type=int, default=None, help="run seeds 0..N-1 instead of --seed")
    p.add_argument("--format", choices=("json", "table"), default="table")
    p.add_argument("--plot", help="write rate and replicas over time (first seed) to this PNG")
    knobs = p.add_argument_group("variants of the default scenario (docs/autoscaling.md)")
    knobs.add_argument("--target-rps", type=float, help="requests/s target per replica (default 8 of capacity 10)")
    knobs.add_argument("--cold-start-s", type=float, help="seconds until a started replica serves (default 180)")
    knobs.add_argument("--noise-sigma", type=float, help="stationary sigma of the AR(1) log-rate noise (default 0.06)")
    knobs.add_argument("--no-burst", action="store_true", help="the trace without its day-3 burst")
    knobs.add_argument("--no-error-headroom", action="store_true", help="predictive: no margin for forecast error")


def config_from_args(args: argparse.Namespace, base: SimConfig = DEFAULT_SIM) -> SimConfig:
    """The scenario with the variant flags applied (flags left out keep the base values)."""
    replace = msgspec.structs.replace
    dep, trace, pred = base.deployment, base.trace, base.policy.predictive
    if getattr(args, "target_rps", None) is not None:
        dep = replace(dep, targets=[MetricTarget(metric="requests_per_s", value=args.target_rps)])
    if getattr(args, "cold_start_s", None) is not None:
        dep = replace(dep, cold_start_s=args.cold_start_s)
    if getattr(args, "noise_sigma", None) is not None:
        trace = replace(trace, noise_sigma=args.noise_sigma)
    if getattr(args, "no_burst", False):
        trace = replace(trace, burst_day=-1)
    if getattr(args, "no_error_headroom", False):
        pred = replace(pred, error_headroom=False)
    policy = replace(base.policy, predictive=pred)
    return replace(base, deployment=dep, trace=trace, policy=policy)


def run_from_args(args: argparse.Namespace, cfg: SimConfig = DEFAULT_SIM) -> int:
    policies = [p.strip() for p in args.policy.split(",") if p.strip()]
    try:
        seeds = list(range(args.seeds)) if args.seeds is not None else [int(s) for s in args.seed.split(",")]
    except ValueError:
        print(f"--seed wants integers, got {args.seed!r}", file=sys.stderr)
        return 2
    if not seeds or not policies:
        print("need at least one policy and one seed", file=sys.stderr)
        return 2
    try:
        runs = run(policies, seeds, config_from_args(args, cfg), want_series=bool(args.plot))
    except ValueError as e:
        print(str(e), file=sys.stderr)
        return 2
    summary = summarise(runs)
    if args.plot:
        plot(runs, Path(args.plot))
    if args.format == "json":
        body = {"runs": [msgspec.to_builtins(msgspec.structs.replace(r, series={})) for r in runs], "summary": summary}
        print(json.dumps(body, indent=2))
    else:
        print(format_table(runs, summary))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ibpool_sim.inference_sim", description=__doc__.splitlines()[0])
    add_arguments(p)
    return run_from_args(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
