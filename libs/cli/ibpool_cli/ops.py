"""The operator's verbs: `ibpool nodes`, `node show`, `jobs`, `job show|cancel`, `submit`, `usage`,
`allocations`, `quota get|set|delete`, `events [--follow]`, `cordon`, `uncordon`, `drain`,
`resume` (or `recover`).

Each finds the services it needs from the bus alone (the NATS service API, as `ibpool services`
does: the leader where replicas elect one) and calls their HTTP APIs: the pool allocator for
capacity and holders, the failover controller for health and operator actions, the scheduler for
jobs. The NATS URL comes from `--nats-url` or IBPOOL_NATS_URL, else from the stack in `--state-dir`
(`ibpool dev up`, `ibpool run`) as its operator user; the API token from `--token` or
IBPOOL_API_TOKEN, else that stack's operator token (an open stack needs none).

Examples:

    ibpool nodes --state-dir .ibpool/run-20261205-1500
    ibpool jobs --state queued,running
    ibpool submit --tenant ml --hosts 2 --gpus-per-host 8 --topology required --time-limit 3600
    ibpool submit -f job.yaml                      # the body of POST /v1/jobs, as YAML or JSON
    ibpool submit --tenant ml --mig 1g.10gb --runtime 600   # one MIG instance
    ibpool job show train-42 --output json
    ibpool job cancel train-42
    ibpool node show node-007
    ibpool allocations --job train-42
    ibpool quota set ml --gpu-model H100 --gpus 64 --cohort research
    ibpool quota get ml
    ibpool quota delete ml --gpu-model H100
    ibpool events --follow --type NodeFailed,RequeueRequested
    source <(ibpool completion bash)               # completion of commands, options and choices
    ibpool usage --since 7d --by tenant            # GPU-hours per tenant over the last week
    ibpool cordon node-007 --reason "fan noisy"    # no new work there; its work stays
    ibpool uncordon node-007 --reason "fan fine"
    ibpool drain node-007 --reason "fan replaced, ticket 1234"   # cordon and requeue its work
    ibpool resume node-007 --gpu 3 --reason "GPU reseated"       # (or recover) put back what was failed/drained

Where to connect: flags, else the environment (IBPOOL_NATS_URL, IBPOOL_API_TOKEN, IBPOOL_NATS_TLS_CA),
else the config file (IBPOOL_CONFIG, default ~/.config/ibpool/config.yaml: `nats_url`, `token`,
`tls_ca`, `state_dir`), else the stack in `--state-dir`.

Exit codes: 0 done; 1 a service could not be reached or refused the request (its error is
printed); 2 a usage error; 4 the job or node named is not known.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import yaml

from ibpool_proto import ALL_MESSAGES, decode
from ibpool_proto.message import Message
from ibpool_runtime import devstack
from ibpool_runtime.bus import Bus, BusUnavailable
from ibpool_runtime.discovery import ServiceView, services
from ibpool_runtime.follow import tail_subscription
from ibpool_runtime.streams import STREAMS, stream_for_subject

# Which instance answers for a service: a leader first, then one that does not elect, then any.
ROLE_ORDER = {"leader": 0, "active": 1}
NOT_FOUND = 4


class OpsError(Exception):
    """What stops a verb, said to the operator; `code` is the exit code, `status` the HTTP status of
    the service's answer when it answered with an error (None: it could not be reached, or no call)."""

    def __init__(self, text: str, code: int = 1, status: int | None = None) -> None:
        super().__init__(text)
        self.code = code
        self.status = status


class Cluster:
    """The running system as the verbs reach it: service URLs found from the bus, and the API token."""

    def __init__(
        self,
        urls: dict[str, str],
        token: str | None,
        http: aiohttp.ClientSession,
        every: dict[str, list[str]] | None = None,
    ) -> None:
        self.urls, self.token, self.http = urls, token, http
        # service -> the HTTP URL of every instance found (node agents: one per agent process).
        self.every = every or {}

    def url(self, service: str) -> str:
        if service not in self.urls:
            found = ", ".join(sorted(self.urls)) or "none"
            raise OpsError(f"no {service} answered on the bus (found: {found})")
        return self.urls[service]

    async def call(self, method: str, service: str, path: str, body: Any = None, **query: str) -> Any:
        return await self.call_at(self.url(service), service, method, path, body, **query)

    async def call_at(self, base: str, service: str, method: str, path: str, body: Any = None, **query: str) -> Any:
        """`call` on one instance (`base`, its HTTP URL) of `service`."""
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        url = base + path
        try:
            async with self.http.request(method, url, json=body, params=query or None, headers=headers) as r:
                text = await r.text()
                answer = json.loads(text) if text else None
                if r.status == 404:
                    raise OpsError(_error_text(answer, f"{method} {path}: not found"), NOT_FOUND, r.status)
                if r.status >= 400:
                    why = _error_text(answer, text)
                    raise OpsError(f"{service} refused {method} {path} ({r.status}): {why}", status=r.status)
                return answer
        except (aiohttp.ClientError, TimeoutError) as e:
            raise OpsError(f"{service} at {url} cannot be reached: {e or type(e).__name__}") from None


def _error_text(answer: Any, default: str) -> str:
    if isinstance(answer, dict) and "error" in answer:
        where = f" at {answer['path']}" if answer.get("path") else ""
        return f"{answer['error']}{where}: {answer.get('detail', '')}".rstrip(": ")
    return default


def choose(found: Sequence[ServiceView]) -> dict[str, str]:
    """service -> the HTTP URL of the instance that answers for it (a leader first)."""
    best: dict[str, ServiceView] = {}
    for v in sorted(found, key=lambda v: (v.service, ROLE_ORDER.get(v.role, 2), v.instance)):
        if v.http_url:
            best.setdefault(v.service, v)
    return {name: v.http_url for name, v in best.items()}


def table(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A plain table, columns padded to their widest cell."""
    all_rows = [list(columns), *([str(c) for c in r] for r in rows)]
    widths = [max(len(r[i]) for r in all_rows) for i in range(len(columns))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in all_rows)


def emit(data: Any, output: str, render: Any, wide: Any = None) -> None:
    """`data` as JSON, YAML, or a table (`render`; `wide`: the table with more columns, where a verb has one)."""
    if output == "json":
        print(json.dumps(data, indent=2))
    elif output == "yaml":
        print(yaml.safe_dump(data, sort_keys=False).rstrip())
    elif output == "wide" and wide is not None:
        print(wide(data))
    else:
        print(render(data))


# -- the verbs -------------------------------------------------------------------------------------


async def _owners(c: Cluster) -> dict[str, str]:
    """Allocation id -> the job holding it (what the pool shows as a GPU's holders)."""
    return {a["allocation_id"]: a["owner"] for a in await c.call("GET", "pool_allocator", "/v1/allocations")}


async def nodes(c: Cluster, args: argparse.Namespace) -> None:
    pool = await c.call("GET", "pool_allocator", "/v1/pool")
    health = {n["node_id"]: n for n in await c.call("GET", "failover_controller", "/health/nodes")}
    owners = await _owners(c)
    out = []
    for n in pool["nodes"]:
        h = health.get(n["node_id"], {})
        jobs = sorted({owners.get(holder, holder) for g in n["gpus"] for holder in g["holders"]})
        models = sorted({g["model"] for g in n["gpus"]})
        out.append(
            {
                "node": n["node_id"],
                "state": n["state"],
                "health": h.get("status", "unknown"),
                "cordoned": bool(h.get("cordoned")),
                "drained": h.get("operator_drain", ""),
                "cordoned_by_operator": h.get("operator_cordon", ""),
                "gpus": len(n["gpus"]),
                "free_gpus": n["free_milli"] / 1000,
                "models": models,
                "jobs": jobs,
                "reason": h.get("reason", ""),
            }
        )

    def render(rows: list[dict[str, Any]], wide: bool = False) -> str:
        cols = ("NODE", "STATE", "HEALTH", "GPUS FREE/ALL", "MODEL", "JOBS", "REASON")
        more = ("HEALTH REASON", "DRAINED BY", "CORDONED BY") if wide else ()
        lines = [
            (
                r["node"],
                r["state"] + (",cordoned" if r["cordoned"] else "") + (",drained" if r["drained"] else ""),
                r["health"],
                f"{r['free_gpus']:g}/{r['gpus']}",
                ",".join(r["models"]),
                ",".join(r["jobs"]) or "-",
                r["reason"] or r["drained"] or r["cordoned_by_operator"],
                *((r["reason"] or "-", r["drained"] or "-", r["cordoned_by_operator"] or "-") if wide else ()),
            )
            for r in rows
        ]
        return table((*cols, *more), lines)

    emit(out, args.output, render, lambda rows: render(rows, wide=True))


def _age(since: str | None, now: dt.datetime) -> str:
    if not since:
        return "-"
    s = int((now - dt.datetime.fromisoformat(since)).total_seconds())
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def _shape(j: dict[str, Any]) -> str:
    if j.get("mig_profile"):
        return f"MIG {j['mig_profile']}"
    if j["milli"] < 1000:
        return f"{j['milli'] / 1000:g} GPU"
    return f"{j['hosts']}x{j['gpus_per_host']}" if j["hosts"] > 1 else str(j["gpus"])


async def node_show(c: Cluster, args: argparse.Namespace) -> None:
    pool = await c.call("GET", "pool_allocator", "/v1/pool")
    found = next((n for n in pool["nodes"] if n["node_id"] == args.node), None)
    if found is None:
        raise OpsError(f"no node {args.node!r} in the pool", NOT_FOUND)
    health = await c.call("GET", "failover_controller", f"/health/nodes/{args.node}")
    owners = await _owners(c)
    verdicts = await c.call("GET", "failover_controller", "/health/verdicts", key=args.node, limit="10")
    gpus = [
        {
            "index": g["index"],
            "model": g["model"],
            "state": g["state"],
            "free": g["free_milli"] / 1000,
            "jobs": sorted({owners.get(h, h) for h in g["holders"]}),
            "health": next(
                ("failed" if x["failed"] else "cordoned" for x in health["gpus"] if x["index"] == g["index"]), "ok"
            ),
        }
        for g in found["gpus"]
    ]
    agent = await _hosting_agent(c, args.node)
    samples = {s["index"]: s for s in (agent or {}).get("telemetry", [])}
    for g in gpus:
        g["telemetry"] = samples.get(g["index"])
    try:
        links = await c.call("GET", "fabric_monitor", "/v1/links", host=args.node)
    except OpsError as e:  # no fabric monitor, or a host its topology does not have: said, not fatal
        links, links_note = [], str(e)
    else:
        links_note = ""
    out = {"node": found["node_id"], "pool_state": found["state"], "health": health, "gpus": gpus}
    out["inventory"] = (
        {"hostname": agent["hostname"], "backend": agent["backend"], "gpus": agent["gpus"], "running": agent["running"]}
        if agent is not None
        else None
    )
    out["links"] = links
    out["links_note"] = links_note
    out["history"] = [{"at": v["occurred_at"], "type": v["type"], "event": v["event"]} for v in verdicts]

    def render(o: dict[str, Any]) -> str:
        h = o["health"]
        head = [
            ("node", o["node"]),
            ("pool state", o["pool_state"]),
            ("health", h["status"] + (f" ({h['reason']})" if h["reason"] else "")),
            ("cordoned", "yes" if h["cordoned"] else "no"),
            ("drained by an operator", h["operator_drain"] or "no"),
            ("cordoned by an operator", h.get("operator_cordon") or "no"),
            ("last heartbeat", h["last_beat"] or "-"),
        ]
        inv = o["inventory"]
        head += [
            ("agent", f"{inv['hostname']} ({inv['backend']}), {len(inv['running'])} workloads" if inv else "not found"),
        ]
        gpu_rows = [
            (
                str(g["index"]),
                g["model"],
                g["state"],
                g["health"],
                f"{g['free']:g}",
                ",".join(g["jobs"]) or "-",
                *_telemetry_cells(g["telemetry"]),
            )
            for g in o["gpus"]
        ]
        history = [(v["at"], v["type"], v["event"].get("reason", "")) for v in o["history"]]
        gpu_cols = ("GPU", "MODEL", "STATE", "HEALTH", "FREE", "JOBS", "UTIL%", "MEM MiB", "TEMP C", "POWER W", "XIDS")
        parts = [table(("FIELD", "VALUE"), head), table(gpu_cols, gpu_rows)]
        link_rows = [
            (lk["adapter"] or "-", "-" if lk["rail"] is None else str(lk["rail"]), lk["peer"] or "-", lk["state"],
             ",".join(lk["problems"]) or "-")
            for lk in o["links"]
        ]  # fmt: skip
        if link_rows:
            parts.append(table(("ADAPTER", "RAIL", "TO", "LINK", "PROBLEMS"), link_rows))
        elif o["links_note"]:
            parts.append(f"links: {o['links_note']}")
        if history:
            parts.append(table(("WHEN", "VERDICT", "REASON"), history))
        return "\n\n".join(parts)

    emit(out, args.output, render)


async def _hosting_agent(c: Cluster, node: str) -> dict[str, Any] | None:
    """The node as the agent hosting it sees it (`GET /v1/nodes/{node}` of each agent found, until one has it)."""
    for base in c.every.get("node_agent", []):
        with contextlib.suppress(OpsError):
            found: dict[str, Any] = await c.call_at(base, "node_agent", "GET", f"/v1/nodes/{node}")
            return found
    return None


def _telemetry_cells(sample: dict[str, Any] | None) -> tuple[str, ...]:
    """A GPU's newest sample as `node show`'s columns: utilisation, memory used, temperature, power, XIDs."""
    if sample is None:
        return ("-",) * 5
    return (
        f"{sample['utilization_pct']:g}",
        str(sample["memory_used_mib"]),
        f"{sample['temperature_c']:g}",
        f"{sample['power_w']:g}",
        ",".join(map(str, sample.get("xids", []))) or "-",
    )


async def allocations(c: Cluster, args: argparse.Namespace) -> None:
    found = await c.call("GET", "pool_allocator", "/v1/allocations", **({"owner": args.job} if args.job else {}))

    def render(rows: list[dict[str, Any]]) -> str:
        cols = ("ALLOCATION", "JOB", "TENANT", "QUEUE", "KIND", "NODES", "LEASE UNTIL")
        lines = [
            (
                a["allocation_id"],
                a["owner"],
                a["tenant"],
                a["queue"],
                a["kind"],
                ",".join(a["nodes"]),
                a["lease_expires_at"],
            )
            for a in rows
        ]
        return table(cols, lines) if lines else "no allocations"

    emit(found, args.output, render)


async def quota(c: Cluster, args: argparse.Namespace) -> None:
    if args.action == "get":
        found = await c.call("GET", "pool_allocator", "/v1/quotas")
        found = [q for q in found if args.name is None or q["quota"]["name"] == args.name]

        def render(rows: list[dict[str, Any]]) -> str:
            cols = ("SCOPE", "NAME", "GPU MODEL", "NOMINAL GPUS", "USED GPUS", "COHORT")
            lines = [
                (
                    q["quota"]["scope"],
                    q["quota"]["name"],
                    q["quota"]["gpu_model"],
                    f"{q['quota']['nominal']['milli'] / 1000:g}",
                    f"{q['used']['milli'] / 1000:g}",
                    q["quota"].get("cohort") or "-",
                )
                for q in rows
            ]
            return table(cols, lines) if lines else "no quotas"

        emit(found, args.output, render)
        return
    if args.name is None or args.gpu_model is None:
        raise OpsError(f"quota {args.action} needs a NAME and --gpu-model", 2)
    if args.action == "delete":
        gone = await c.call(
            "DELETE", "pool_allocator", f"/v1/quotas/{args.name}", gpu_model=args.gpu_model, scope=args.scope
        )
        emit(gone, args.output, lambda q: f"{q['scope']} {q['name']} on {q['gpu_model']}: quota removed")
        return
    if args.gpus is None:
        raise OpsError("quota set needs --gpus (the nominal share, in GPUs)", 2)
    body: dict[str, Any] = {
        "gpu_model": args.gpu_model,
        "scope": args.scope,
        "nominal": {"milli": round(args.gpus * 1000)},
    }
    if args.cohort:
        body["cohort"] = args.cohort
    if args.borrow is not None:
        body["borrowing_limit"] = {"milli": round(args.borrow * 1000)}
    q = await c.call("PUT", "pool_allocator", f"/v1/quotas/{args.name}", body)
    emit(
        q, args.output, lambda q: f"{q['scope']} {q['name']} on {q['gpu_model']}: {q['nominal']['milli'] / 1000:g} GPUs"
    )


async def jobs(c: Cluster, args: argparse.Namespace) -> None:
    query = {"limit": str(args.limit)}
    if args.state:
        query["state"] = args.state
    elif not args.all:
        query["live"] = "true"
    for key in ("tenant", "queue"):
        if getattr(args, key):
            query[key] = getattr(args, key)
    found = await c.call("GET", "scheduler", "/v1/jobs", **query)
    now = dt.datetime.now(dt.UTC)

    def render(rows: list[dict[str, Any]], wide: bool = False) -> str:
        cols = ("JOB", "TENANT", "QUEUE", "STATE", "GPUS", "AGE", "NODES / WHY IT WAITS")
        more = ("PRIORITY", "ATTEMPT", "SUBMITTED", "TIER", "SHARP") if wide else ()
        lines = [
            (
                j["job_id"],
                j["tenant"],
                j["queue"],
                j["state"],
                _shape(j),
                _age(j.get("submitted_at"), now),
                ",".join(j["nodes"]) if j["nodes"] else j["reason"],
                *(_wide_job(j) if wide else ()),
            )
            for j in rows
        ]
        return table((*cols, *more), lines) if lines else "no jobs"

    emit(found, args.output, render, lambda rows: render(rows, wide=True))


def _wide_job(j: dict[str, Any]) -> tuple[str, ...]:
    """`ibpool jobs -o wide`'s more columns: priority, attempt, when submitted, its placement's tier and SHARP."""
    placed = j.get("placement") or {}
    tier = placed.get("tier")
    return (
        str(j["priority"]),
        str(j["attempt"]),
        str(j["submitted_at"])[:19],
        "-" if tier is None else str(tier),
        "yes" if placed.get("sharp") else "-",
    )


def when(text: str, now: dt.datetime) -> str:
    """`--since`/`--until`: an ISO 8601 time (UTC when it names no zone), or a time ago: 30m, 24h, 7d."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800}
    if text[-1:] in units and text[:-1].replace(".", "", 1).isdigit():
        return (now - dt.timedelta(seconds=float(text[:-1]) * units[text[-1]])).isoformat()
    try:
        at = dt.datetime.fromisoformat(text)
    except ValueError:
        raise OpsError(f"{text!r} is neither an ISO 8601 time nor a time ago (30m, 24h, 7d)", 2) from None
    return (at if at.tzinfo is not None else at.replace(tzinfo=dt.UTC)).isoformat()


async def usage(c: Cluster, args: argparse.Namespace) -> None:
    now = dt.datetime.now(dt.UTC)
    query = {"since": when(args.since, now), "by": args.by}
    if args.until:
        query["until"] = when(args.until, now)
    report = await c.call("GET", "scheduler", "/v1/usage", **query)

    def render(r: dict[str, Any]) -> str:
        keys = [k for k in ("tenant", "queue") if k in r["by"]]
        cols = (*(k.upper() for k in keys), "GPU-HOURS", "JOBS")
        lines = [(*(row[k] for k in keys), f"{row['gpu_hours']:.2f}", str(row["jobs"])) for row in r["rows"]]
        lines.append((*(["total"] + [""] * (len(keys) - 1)), f"{r['gpu_hours']:.2f}", str(r["jobs"])))
        return f"GPU-hours from {r['since']} to {r['until']}\n" + table(cols, lines)

    emit(report, args.output, render)


async def job_show(c: Cluster, args: argparse.Namespace) -> None:
    j = await c.call("GET", "scheduler", f"/v1/jobs/{args.job_id}")

    def render(j: dict[str, Any]) -> str:
        keys = (
            *("job_id", "name", "tenant", "queue", "state", "priority", "attempt", "submitted_at", "scheduled_at"),
            *("started_at", "finished_at", "nodes", "reason", "wait_code", "time_limit_s", "allocation_id"),
        )
        rows = [
            (k, j[k] if not isinstance(j.get(k), list) else ",".join(j[k]))
            for k in keys
            if j.get(k) not in (None, "", [])
        ]
        rows.insert(4, ("gpus", _shape(j)))
        return table(("FIELD", "VALUE"), [(k, str(v)) for k, v in rows])

    emit(j, args.output, render)


async def job_cancel(c: Cluster, args: argparse.Namespace) -> None:
    j = await c.call("DELETE", "scheduler", f"/v1/jobs/{args.job_id}")
    emit(j, args.output, lambda j: f"{j['job_id']}: {j['state']}")


def job_body(args: argparse.Namespace) -> dict[str, Any]:
    """The body of POST /v1/jobs from a file (-f) and the flags given (a flag wins over the file)."""
    body: dict[str, Any] = {}
    if args.file:
        text = sys.stdin.read() if args.file == "-" else Path(args.file).read_text()
        loaded = yaml.safe_load(text)
        if not isinstance(loaded, dict):
            raise OpsError(f"{args.file}: a job file is one mapping (the body of POST /v1/jobs)", 2)
        body = loaded
    flags = {
        "id": args.id,
        "name": args.name,
        "tenant": args.tenant,
        "queue": args.queue,
        "priority": args.priority,
        "gpus": args.gpus,
        "hosts": args.hosts,
        "gpus_per_host": args.gpus_per_host,
        "fraction": args.fraction,
        "mig": args.mig,
        "dataset": args.dataset,
        "gpu_model": args.gpu_model,
        "time_limit_s": args.time_limit,
    }
    body.update({k: v for k, v in flags.items() if v is not None})
    if args.topology is not None:
        body["topology"] = {"constraint": args.topology, "level": args.topology_level}
    if args.runtime is not None:
        body["workload"] = {"simulated_runtime_s": args.runtime}
    if "tenant" not in body:
        raise OpsError("a job needs a tenant (--tenant, or `tenant` in the job file)", 2)
    return body


async def submit(c: Cluster, args: argparse.Namespace) -> None:
    j = await c.call("POST", "scheduler", "/v1/jobs", job_body(args))
    emit(j, args.output, lambda j: f"{j['job_id']}: {j['state']} (GPUs: {_shape(j)}, tenant {j['tenant']})")


async def _operator_action(c: Cluster, args: argparse.Namespace, action: str) -> None:
    """POST the failover controller's operator action on the node (or its GPU, --gpu) with the reason."""
    gpu = getattr(args, "gpu", None)
    path = f"/health/nodes/{args.node}" + (f"/gpus/{gpu}" if gpu is not None else "") + f"/{action}"
    answer = await c.call("POST", "failover_controller", path, {"reason": args.reason})
    emit(answer, args.output, lambda a: f"{args.node}: {a.get('outcome', '')}: {a.get('detail', '')}")


async def drain(c: Cluster, args: argparse.Namespace) -> None:
    await _operator_action(c, args, "drain")


async def cordon(c: Cluster, args: argparse.Namespace) -> None:
    await _operator_action(c, args, "cordon")


async def uncordon(c: Cluster, args: argparse.Namespace) -> None:
    await _operator_action(c, args, "uncordon")


async def recover(c: Cluster, args: argparse.Namespace) -> None:
    await _operator_action(c, args, "recover")


async def events(args: argparse.Namespace, url: str) -> None:
    """The bus's stored events, oldest first per stream: the last `--last` of each stream, then, with
    `--follow`, each new one as it comes, until Ctrl-C or `--max` events. Read as the stack's
    `subscriber` user through ephemeral consumers that are gone a minute after the command."""
    wanted = _event_types(args.type)
    bus = await Bus.connect(url, name="ibpool-events", attempts=2, tls_ca=args.tls_ca)
    shown = 0
    try:
        subs = []
        for spec in STREAMS:
            subjects = sorted(
                {t.subject_pattern() for t in wanted if stream_for_subject(t.subject_pattern()) == spec.name}
            )
            if wanted and not subjects:
                continue
            sub, _ = await tail_subscription(bus, spec.name, subjects or list(spec.subjects), back=args.last)
            subs.append(sub)
        if args.follow:
            print(f"following {len(subs)} streams (Ctrl-C to stop)", file=sys.stderr, flush=True)
        while args.max is None or shown < args.max:
            got = 0
            for sub in subs:
                try:
                    msgs = await sub.fetch(batch=100, timeout=0.5 if args.follow else 0.2)
                except TimeoutError:
                    continue
                for msg in msgs:
                    if args.max is not None and shown >= args.max:
                        break
                    got += 1
                    shown += 1
                    print(_event_line(msg.data, args.output), flush=True)
            if not got and not args.follow:
                break
    finally:
        await bus.close()


def _event_types(names: Sequence[str] | None) -> list[type[Message]]:
    """The message types `--type` names (a class name, JobScheduled, or a CloudEvents type)."""
    if not names:
        return []
    by_name = {m.__name__.lower(): m for m in ALL_MESSAGES} | {m.ce_type(): m for m in ALL_MESSAGES}
    out = []
    for n in names:
        for one in n.split(","):
            found = by_name.get(one.strip().lower()) or by_name.get(one.strip())
            if found is None:
                raise OpsError(f"no event type {one!r} (for instance: JobScheduled, NodeFailed, AllocationGranted)", 2)
            if not found.stored:
                raise OpsError(f"{found.__name__} is not stored (core NATS only): it cannot be listed", 2)
            out.append(found)
    return out


def _event_line(data: bytes, output: str) -> str:
    try:
        ev = decode(data)
    except msgspec.DecodeError as e:
        return f"(not an ibpool event: {e})"
    if output in ("json", "yaml"):
        return json.dumps(msgspec.to_builtins(ev))
    fields = {
        k: v for k, v in msgspec.to_builtins(ev).items() if k not in ("id", "source", "key", "occurred_at", "type")
    }
    text = json.dumps(fields, separators=(",", ":"))
    when = ev.occurred_at.isoformat(timespec="seconds") if ev.occurred_at else "-"
    return f"{when}  {type(ev).__name__:<22} {ev.key:<24} {text[:160]}"


# -- wiring ----------------------------------------------------------------------------------------

VERBS = {
    "nodes": (nodes, "every node: pool state, health, GPUs free of all, models, the jobs on it (sinfo-like)"),
    "node": (node_show, "one node: `ibpool node show NODE` (its GPUs with their jobs and health, its verdicts)"),
    "allocations": (allocations, "live allocations (GPUs granted to jobs), or one job's (--job)"),
    "quota": (
        quota,
        "`ibpool quota get [NAME]`, `quota set NAME --gpu-model M --gpus N`, `quota delete NAME --gpu-model M`",
    ),
    "jobs": (jobs, "live jobs (or --all, --state) with where they run or why they wait (squeue-like)"),
    "job": (None, "one job: `ibpool job show ID`, `ibpool job cancel ID`"),
    "submit": (submit, "submit a job from flags or a YAML/JSON job file"),
    "usage": (usage, "GPU-hours held by jobs in a window, by tenant and queue (sreport-like)"),
    "events": (None, "the bus's stored events: the last of each stream, and with --follow each new one"),
    "cordon": (cordon, "no new work on a node (or one GPU, --gpu); its work stays, with a reason"),
    "uncordon": (uncordon, "lift an operator's cordon of a node (or one GPU, --gpu)"),
    "drain": (drain, "cordon a node and requeue its work, with a reason (an operator's drain)"),
    "resume": (recover, "put back a drained, cordoned or failed node (or one GPU, --gpu): scontrol's resume"),
    "recover": (recover, "the same as resume"),
}


# The keys of the operator's config file, and what each fills in when neither a flag nor the environment does.
CONFIG_KEYS = {
    "nats_url": "--nats-url (IBPOOL_NATS_URL)",
    "token": "--token (IBPOOL_API_TOKEN)",
    "tls_ca": "--tls-ca (IBPOOL_NATS_TLS_CA)",
    "state_dir": "--state-dir",
}


def config_path() -> Path:
    """IBPOOL_CONFIG, else $XDG_CONFIG_HOME/ibpool/config.yaml (~/.config/ibpool/config.yaml)."""
    if os.environ.get("IBPOOL_CONFIG"):
        return Path(os.environ["IBPOOL_CONFIG"])
    return Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "ibpool" / "config.yaml"


def file_defaults(path: Path) -> dict[str, str]:
    """The operator's config file (YAML: `nats_url`, `token`, `tls_ca`, `state_dir`); {} when there is none.
    Anything else in it, or a value that is not a string, is an error naming the file and the key."""
    if not path.exists():
        return {}
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise OpsError(f"{path}: cannot read it as YAML: {e}", 2) from None
    if not isinstance(data, dict):
        raise OpsError(f"{path}: must be a mapping of {', '.join(CONFIG_KEYS)}", 2)
    for key, value in data.items():
        if key not in CONFIG_KEYS:
            raise OpsError(f"{path}: unknown key {key!r} (known: {', '.join(CONFIG_KEYS)})", 2)
        if not isinstance(value, str):
            raise OpsError(f"{path}: {key} must be a string, got {type(value).__name__}", 2)
    return dict(data)


def connection_options(p: argparse.ArgumentParser, conf: dict[str, str]) -> None:
    """--nats-url, --state-dir and --tls-ca: each from the flag, else the environment, else the config file."""
    p.add_argument("--nats-url", default=os.environ.get("IBPOOL_NATS_URL") or conf.get("nats_url", ""))
    p.add_argument(
        "--state-dir", default=conf.get("state_dir", ".ibpool/dev"), help="the stack to use when no NATS URL is given"
    )
    p.add_argument(
        "--tls-ca",
        default=os.environ.get("IBPOOL_NATS_TLS_CA") or conf.get("tls_ca", ""),
        help="CA (PEM) of the NATS servers",
    )


def parser(verb: str, conf: dict[str, str] | None = None) -> argparse.ArgumentParser:
    """`verb`'s options, their defaults from `conf` (the operator's config file when None)."""
    doc = __doc__ or ""
    conf = file_defaults(config_path()) if conf is None else conf
    p = argparse.ArgumentParser(
        prog=f"ibpool {verb}",
        description=VERBS[verb][1],
        epilog=doc.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    connection_options(p, conf)
    p.add_argument(
        "--token", default=os.environ.get("IBPOOL_API_TOKEN") or conf.get("token", ""), help="API bearer token"
    )
    p.add_argument(
        "--output", "-o", choices=["table", "wide", "json", "yaml"], default="table", help="wide: more columns"
    )
    p.add_argument("--wait", type=float, default=1.0, help="seconds to wait for services to answer (default 1)")
    if verb == "jobs":
        p.add_argument("--state", help="comma-separated states (queued,proposed,scheduled,running,...)")
        p.add_argument("--all", action="store_true", help="finished jobs too (the newest --limit)")
        p.add_argument("--tenant")
        p.add_argument("--queue")
        p.add_argument("--limit", type=int, default=100)
    elif verb == "usage":
        p.add_argument("--since", default="24h", help="from: an ISO 8601 time or a time ago (30m, 24h, 7d)")
        p.add_argument("--until", help="to: an ISO 8601 time or a time ago (default now)")
        p.add_argument("--by", choices=["tenant", "queue", "tenant,queue"], default="tenant,queue")
    elif verb == "job":
        p.add_argument("action", choices=["show", "cancel"])
        p.add_argument("job_id")
    elif verb == "node":
        p.add_argument("action", choices=["show"])
        p.add_argument("node")
    elif verb == "allocations":
        p.add_argument("--job", help="only this job's")
    elif verb == "quota":
        p.add_argument("action", choices=["get", "set", "delete"])
        p.add_argument("name", nargs="?", help="the tenant (or queue, --scope queue)")
        p.add_argument("--gpu-model", help="its NVML name or words of it: H100, a100")
        p.add_argument("--scope", choices=["tenant", "queue"], default="tenant")
        p.add_argument("--gpus", type=float, help="set: the nominal share, in GPUs (0.5: half a GPU)")
        p.add_argument("--cohort", help="set: share idle quota with the others of this cohort")
        p.add_argument("--borrow", type=float, help="set: how many GPUs past its share it may borrow")
    elif verb == "submit":
        p.add_argument("-f", "--file", help="a job file (YAML or JSON: the body of POST /v1/jobs); - for stdin")
        p.add_argument("--id")
        p.add_argument("--name")
        p.add_argument("--tenant")
        p.add_argument("--queue")
        p.add_argument("--priority", type=int)
        p.add_argument("--gpus", type=int, help="GPUs on one host (or the gang's total with --hosts)")
        p.add_argument("--hosts", type=int, help="a gang of this many hosts")
        p.add_argument("--gpus-per-host", type=int)
        p.add_argument("--fraction", type=float, help="a share of one GPU (0 < f < 1)")
        p.add_argument("--mig", metavar="PROFILE", help="one MIG instance of this profile (1g.10gb, 3g.40gb, ...)")
        p.add_argument("--topology", choices=["required", "preferred"], help="keep a gang under one fabric tier")
        p.add_argument("--topology-level", type=int, default=1, help="1: one leaf group (default)")
        p.add_argument("--dataset")
        p.add_argument("--gpu-model")
        p.add_argument("--time-limit", type=float, help="seconds")
        p.add_argument("--runtime", type=float, help="simulated work, seconds (the simulated node agents)")
    elif verb == "events":
        p.add_argument(
            "--type", action="append", help="only these (JobScheduled, NodeFailed,...; repeat or comma-separate)"
        )
        p.add_argument("--last", type=int, default=10, help="how many stored events of each stream first (default 10)")
        p.add_argument("--follow", "-f", action="store_true", help="then each new event as it comes, until Ctrl-C")
        p.add_argument("--max", type=int, help="stop after this many events")
    elif verb in ("drain", "cordon", "uncordon", "resume", "recover"):
        p.add_argument("node")
        p.add_argument("--reason", required=True, help="why (a ticket, what was done); it goes into the events")
        if verb != "drain":
            p.add_argument("--gpu", type=int, help=f"{verb} this GPU only")
    return p


def completion(top_level: Sequence[str]) -> str:
    """A bash completion function for `ibpool`: its commands, and each operator verb's options and
    choices (taken from the verbs' own parsers). `source <(ibpool completion bash)`."""
    cases = []
    for verb in VERBS:
        words: list[str] = []
        for action in parser(verb, {})._actions:  # the options only: no config file read
            words += action.option_strings
            if not action.option_strings and action.choices:
                words += [str(c) for c in action.choices]
        cases.append(f'        {verb}) words="{" ".join(sorted(set(words)))}" ;;')
    body = "\n".join(cases)
    return f"""_ibpool() {{
    local cur="${{COMP_WORDS[COMP_CWORD]}}" words=""
    if [ "$COMP_CWORD" -eq 1 ]; then
        words="{" ".join(sorted(top_level))}"
    else
        case "${{COMP_WORDS[1]}}" in
{body}
        esac
    fi
    COMPREPLY=($(compgen -W "$words" -- "$cur"))
}}
complete -o default -F _ibpool ibpool
"""


def main(verb: str, argv: list[str]) -> int:
    try:
        args = parser(verb).parse_args(argv)
    except OpsError as e:  # the config file
        print(f"ibpool {verb}: {e}", file=sys.stderr)
        return e.code
    try:
        if verb == "events":
            with contextlib.suppress(KeyboardInterrupt):
                asyncio.run(events(args, _nats_url(args, "subscriber")))
            return 0
        run = job_show if verb == "job" and args.action == "show" else job_cancel if verb == "job" else VERBS[verb][0]
        assert run is not None
        return asyncio.run(_main(run, args))
    except OpsError as e:
        print(f"ibpool {verb}: {e}", file=sys.stderr)
        return e.code


def _nats_url(args: argparse.Namespace, user: str, info: devstack.StackInfo | None = None) -> str:
    """--nats-url (or IBPOOL_NATS_URL), else the stack's in --state-dir (`info`, read when not given) as `user`."""
    if args.nats_url:
        return str(args.nats_url)
    info = info or devstack.read_info(Path(args.state_dir))
    if info is None:
        raise OpsError(f"no stack in {args.state_dir} and no --nats-url (or IBPOOL_NATS_URL)")
    return devstack.nats_url_as(info, user)


async def _main(run: Any, args: argparse.Namespace) -> int:
    info = devstack.read_info(Path(args.state_dir)) if not (args.nats_url and args.token) else None
    url, token = _nats_url(args, "operator", info), args.token or None
    if token is None and info is not None:
        token = devstack.api_token(info, "operator")
    try:
        bus = await Bus.connect(url, name="ibpool-ops", attempts=2, tls_ca=args.tls_ca)
    except BusUnavailable as e:
        raise OpsError(str(e)) from None
    try:
        found = await services(bus, wait_s=args.wait)
    finally:
        await bus.close()
    every: dict[str, list[str]] = {}
    for v in sorted(found, key=lambda v: (v.service, v.instance)):
        if v.http_url:
            every.setdefault(v.service, []).append(v.http_url)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
        await run(Cluster(choose(found), token, http, every), args)
    return 0
