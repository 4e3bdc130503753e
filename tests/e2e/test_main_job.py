"""The main job and the dev stack commands, run as an operator runs them."""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from ibpool_runtime import slurmstack
from tests.bench.bench_scale import SERVICES, table
from tests.integration.conftest import stack_dir
from tests.integration.slurm_support import require_slurm

CLI = [sys.executable, "-m", "ibpool_cli"]


def test_dev_up_status_down() -> None:
    root = stack_dir()
    state = root / "dev"
    up = subprocess.run([*CLI, "dev", "up", "--state-dir", str(state)], capture_output=True, text=True, timeout=120)
    try:
        assert up.returncode == 0, up.stderr
        # Locked by default: the Postgres password is never printed, the secrets are in the state dir.
        assert "nats://127.0.0.1:" in up.stdout and "postgresql://postgres:***@127.0.0.1:" in up.stdout
        password = (state / "secrets" / "postgres.password").read_text().strip()
        assert password and password not in up.stdout and f"secrets   {state.resolve()}/secrets" in up.stdout
        env = (state / "stack.env").read_text()
        assert env.startswith("IBPOOL_NATS_URL=nats://127.0.0.1:") and f":{password}@" in env
        assert "IBPOOL_SCHEDULER_NATS_URL=nats://scheduler:" in env and "IBPOOL_SCHEDULER_API_TOKENS_FILE=" in env
        status = subprocess.run([*CLI, "dev", "status", "--state-dir", str(state)], capture_output=True, text=True)
        assert status.returncode == 0 and status.stdout.count(", up)") == 2, status.stdout
        assert "jetstream_sync" in status.stdout and "always" in status.stdout
    finally:
        down = subprocess.run([*CLI, "dev", "down", "--state-dir", str(state)], capture_output=True, text=True)
    assert down.returncode == 0 and "stopped" in down.stdout
    after = subprocess.run([*CLI, "dev", "status", "--state-dir", str(state)], capture_output=True, text=True)
    shutil.rmtree(root, ignore_errors=True)
    assert "not running" in after.stdout


def test_dev_up_insecure_is_an_open_stack() -> None:
    root = stack_dir()
    state = root / "open"
    cmd = [*CLI, "dev", "up", "--insecure", "--state-dir", str(state)]
    up = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    try:
        assert up.returncode == 0, up.stderr
        assert "postgresql://postgres@127.0.0.1:" in up.stdout and "secrets" not in up.stdout
        assert not (state / "secrets").exists()
        # Its one credential: the system account's, with which the failover controller reads
        # nats-server's connection advisories (clients need none).
        assert (state / "nats-system.password").stat().st_mode & 0o077 == 0
        assert "_NATS_URL=" not in (state / "stack.env").read_text().split("\n", 1)[1]
    finally:
        subprocess.run([*CLI, "dev", "down", "--state-dir", str(state)], capture_output=True, text=True)
        shutil.rmtree(root, ignore_errors=True)


def slurm_here() -> bool:
    """Whether this run can have a throw-away Slurm beside it (`--slurm`); under IBPOOL_REQUIRE_SLURM=1
    it must (`.ci/run` installs Slurm), so a missing program fails the test instead of narrowing it."""
    if os.environ.get("IBPOOL_REQUIRE_SLURM") == "1":
        require_slurm()
        return True
    return not slurmstack.unavailable()


def test_run_scenario_all_nodes_heartbeat_within_10s_and_exits_zero() -> None:
    root = stack_dir()
    costs = root / "measured.json"
    with_slurm = slurm_here()
    r = subprocess.run(
        [
            *CLI,
            "run",
            "--nodes",
            "16",
            "--duration",
            "30",
            "--state-dir",
            str(root / "run"),
            "--measure",
            str(costs),
            *(["--slurm"] if with_slurm else []),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"},
    )
    measured = json.loads(costs.read_text()) if costs.exists() else None
    shutil.rmtree(root, ignore_errors=True)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "nodes registered" in out and "17/17" in out  # 16 on the fabric and the spare the scenario kills
    assert "all nodes heartbeating within 10 s" in out
    assert "NO" not in out.split("ibpool run: summary", 1)[1]
    assert "fabric topology published" in out and "v1, 16 hosts" in out
    assert "faulty links recovered after clearing" in out and "2/2" in out
    assert "node-017's agent SIGKILLed: failed by the failover controller" in out
    assert "jobs submitted to the scheduler" in out and "8 of 8" in out
    assert "every multi-node placement within" in out and "(required 2)" in out
    assert "wide-gang (5 hosts, required under" in out and "placements with SHARP hold SHARP" in out
    assert "inference deployment scaled up with the load and back down" in out
    assert "elastic training job grown into idle GPUs" in out
    assert "stack stopped" in out
    if with_slurm:  # Slurm beside it: the fabric became its topology, the killed node drained and resumed
        assert "Slurm: the published fabric is its topology.conf" in out and "16 of 16 hosts under" in out
        assert "Slurm: node-017 drained by ibpool after its agent's SIGKILL" in out
        assert "Slurm: node-017 resumed by ibpool after it recovered" in out
    # What the run cost (the scale harness's measure, bench_scale.py, at its smallest size).
    assert measured is not None, out
    assert measured["nodes"] == 17 and measured["summary_ok"] is True
    assert 0 < measured["steady_s"] < measured["duration_s"]
    for name in (*SERVICES, "nats-server", "postgres"):
        cost = measured["processes"][name]
        assert cost["cpu_s"] > 0 and 0 < cost["steady_cpu_s"] <= cost["cpu_s"] and cost["peak_rss_mib"] > 10, name
    assert measured["events_per_s"]["io.ibpool.node.heartbeat.sent.v1"] > 10  # 17 nodes, one beat a second
    start, end = measured["stream_bytes"]["IBPOOL_NODE"]
    assert end > start > 0  # telemetry and registrations; heartbeats are not stored
    assert {"pool_allocator", "scheduler", "failover_controller"} <= set(measured["postgres"])
    assert measured["queued_to_scheduled_p99_s"] is not None and measured["cycle_p99_s"] is not None
    assert measured["kill_to_failed_s"] is not None and 0 < measured["kill_to_failed_s"] < 10
    rendered = table([{"nodes_asked": 16, "rc": 0, "wall_s": 60.0, "measured": measured}])
    assert "| 17 (136) |" in rendered and "| 17 | " in rendered


def ops(state: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """An operator's verb (`ibpool nodes`, `jobs`, ...) against the stack in `state`, as a user runs it."""
    cmd = [*CLI, *argv, "--state-dir", str(state), "--wait", "0.5"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"})


def ops_json(state: Path, *argv: str) -> Any:
    r = ops(state, *argv, "--output", "json")
    assert r.returncode == 0, f"ibpool {' '.join(argv)}: {r.stderr}"
    return json.loads(r.stdout)


def operate_from_the_cli(state: Path) -> None:
    """Every verb of ibpool's operator CLI against the running system, found from the bus alone."""
    nodes = ops_json(state, "nodes")
    assert {n["node"] for n in nodes} == {f"node-{i:03d}" for i in range(1, 6)}  # 4 and the spare
    assert all(n["gpus"] == 8 and n["health"] == "healthy" for n in nodes), nodes
    table = ops(state, "nodes")
    assert table.returncode == 0 and table.stdout.startswith("NODE") and "node-005" in table.stdout
    submitted = ops_json(state, "submit", "--tenant", "ops", "--gpus", "1", "--runtime", "2", "--id", "cli-one")
    assert submitted["job_id"] == "cli-one" and submitted["tenant"] == "ops"
    deadline = time.monotonic() + 60
    while ops_json(state, "job", "show", "cli-one")["state"] not in ("scheduled", "running", "completed"):
        assert time.monotonic() < deadline, "cli-one was not scheduled within 60 s"
        time.sleep(0.5)
    share = ops_json(state, "submit", "--tenant", "ops", "--fraction", "0.25", "--runtime", "1", "--id", "cli-share")
    assert (share["milli"], share["gpus"]) == (250, 1), share
    found = ops_json(state, "services")
    assert {"scheduler", "pool_allocator", "failover_controller", "dashboard"} <= {v["service"] for v in found}, found
    sliced = ops_json(state, "submit", "--tenant", "ops", "--mig", "1g.10gb", "--runtime", "1", "--id", "cli-mig")
    assert (sliced["mig_profile"], sliced["gpus"]) == ("1g.10gb", 1), sliced
    deadline = time.monotonic() + 60
    while (mig_job := ops_json(state, "job", "show", "cli-mig"))["state"] != "completed":
        assert time.monotonic() < deadline, f"cli-mig did not complete within 60 s: {mig_job}"
        time.sleep(0.5)
    assert [a["mig_profile"] for a in mig_job["assignments"]] == ["1g.10gb"], mig_job
    job_file = state / "gang.yaml"
    job_file.write_text("id: cli-gang\ntenant: ops\nhosts: 2\ngpus_per_host: 1\ntopology: {constraint: required}\n")
    assert ops_json(state, "submit", "-f", str(job_file))["hosts"] == 2
    listed = {j["job_id"] for j in ops_json(state, "jobs", "--all")}
    wide = ops(state, "jobs", "--all", "-o", "wide")
    assert wide.returncode == 0 and "PRIORITY" in wide.stdout and "cli-one" in wide.stdout, wide.stderr
    assert "CORDONED BY" in ops(state, "nodes", "-o", "wide").stdout
    assert {"cli-one", "cli-gang"} <= listed
    assert ops_json(state, "job", "cancel", "cli-gang")["state"] == "cancelled"
    drained = ops(state, "drain", "node-002", "--reason", "e2e: fan replaced")
    assert drained.returncode == 0 and "cordoned and drained" in drained.stdout, drained.stderr
    assert next(n for n in ops_json(state, "nodes") if n["node"] == "node-002")["drained"] == "e2e: fan replaced"
    back = ops(state, "resume", "node-002", "--reason", "e2e: back")
    assert back.returncode == 0 and "put back" in back.stdout, back.stderr
    cordoned = ops_json(state, "cordon", "node-003", "--gpu", "2", "--reason", "e2e: fan noise")
    assert (cordoned["outcome"], cordoned["events"]) == ("done", ["Cordoned"]), cordoned
    gpu2 = next(g for g in ops_json(state, "node", "show", "node-003")["health"]["gpus"] if g["index"] == 2)
    assert (gpu2["cordoned"], gpu2["operator_cordon"]) == (True, "e2e: fan noise"), gpu2
    assert ops_json(state, "uncordon", "node-003", "--gpu", "2", "--reason", "e2e: fine")["events"] == ["Uncordoned"]
    assert ops_json(state, "cordon", "node-004", "--reason", "e2e: watch")["events"] == ["Cordoned"]
    deadline = time.monotonic() + 30
    while (n4 := next(n for n in ops_json(state, "nodes") if n["node"] == "node-004"))["state"] != "cordoned":
        assert time.monotonic() < deadline, f"the pool did not cordon node-004 within 30 s: {n4}"
        time.sleep(0.5)
    assert n4["cordoned_by_operator"] == "e2e: watch" and n4["health"] == "healthy", n4
    assert ops_json(state, "uncordon", "node-004", "--reason", "e2e: fine")["events"] == ["Uncordoned"]
    shown = ops_json(state, "node", "show", "node-002")
    verdicts = [v["type"] for v in shown["history"]]  # newest first
    assert len(shown["gpus"]) == 8 and verdicts[0] == "Uncordoned" and "DrainRequested" in verdicts, verdicts
    # Its inventory and newest telemetry from the agent hosting it, its cables from the fabric monitor.
    assert shown["inventory"]["hostname"] and len(shown["inventory"]["gpus"]) == 8, shown["inventory"]
    assert len(shown["links"]) == 8 and {lk["rail"] for lk in shown["links"]} == set(range(8)), shown["links"]
    assert all(lk["peer"].startswith("leaf") and lk["state"] in ("up", "unknown") for lk in shown["links"])
    deadline = time.monotonic() + 30
    while not all(g["telemetry"] for g in shown["gpus"]):
        assert time.monotonic() < deadline, f"no telemetry of node-002's GPUs within 30 s: {shown['gpus']}"
        time.sleep(1)
        shown = ops_json(state, "node", "show", "node-002")
    assert all(0 <= g["telemetry"]["utilization_pct"] <= 100 for g in shown["gpus"])
    assert "UTIL%" in ops(state, "node", "show", "node-002").stdout
    held = ops_json(state, "allocations", "--job", "cli-one")
    assert [a["owner"] for a in held] in ([], ["cli-one"])  # held, or it already ran its 2 s
    set_q = ops_json(state, "quota", "set", "ops", "--gpu-model", "h100", "--gpus", "2")
    assert set_q["gpu_model"].endswith("H100 80GB HBM3") and set_q["nominal"]["milli"] == 2000
    assert [q["quota"]["name"] for q in ops_json(state, "quota", "get", "ops")] == ["ops"]
    assert ops_json(state, "quota", "delete", "ops", "--gpu-model", "H100")["name"] == "ops"
    assert ops_json(state, "quota", "get", "ops") == []
    scheduled = [
        json.loads(line)
        for line in ops(state, "events", "--type", "JobScheduled", "--last", "100", "-o", "json").stdout.splitlines()
    ]
    assert "cli-one" in {e["job_id"] for e in scheduled}
    # The demonstration's autoscaler queues jobs of its own meanwhile: read until ours comes (at most 50).
    follow = [*CLI, "events", "--follow", "--max", "50", "--type", "JobQueued", "--last", "0"]
    follow += ["--state-dir", str(state)]
    tail = subprocess.Popen(
        follow, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={"PATH": "/usr/bin:/bin"}
    )
    assert tail.stderr is not None and tail.stderr.readline().startswith("following")  # its consumers are made
    ops_json(state, "submit", "--tenant", "ops", "--gpus", "1", "--runtime", "1", "--id", "cli-followed")
    seen_lines: list[str] = []
    deadline = time.monotonic() + 60
    try:
        assert tail.stdout is not None
        while not any("cli-followed" in line for line in seen_lines):
            assert time.monotonic() < deadline and tail.poll() is None, f"cli-followed not followed: {seen_lines}"
            ready, _, _ = select.select([tail.stdout], [], [], 1.0)
            if ready:
                seen_lines.append(tail.stdout.readline())
    finally:
        tail.terminate()
        tail.communicate(timeout=30)
    assert all("JobQueued" in line for line in seen_lines if line.strip()), seen_lines
    used = ops_json(state, "usage", "--since", "1h", "--by", "tenant")
    [mine] = [r for r in used["rows"] if r["tenant"] == "ops"]
    assert mine["queue"] is None and mine["jobs"] >= 1 and mine["gpu_hours"] > 0, used
    report = ops(state, "usage", "--since", "1h")
    assert report.returncode == 0 and "GPU-HOURS" in report.stdout and "ops" in report.stdout, report.stderr
    missing = ops(state, "job", "show", "no-such-job")
    assert missing.returncode == 4 and "no job" in missing.stderr
    untenanted = ops(state, "submit", "--gpus", "1")
    assert untenanted.returncode == 2 and "needs a tenant" in untenanted.stderr


def test_run_serve_starts_a_service_that_died_again_and_serves_the_operator_cli() -> None:
    """`ibpool run --serve` keeps the system up: the operator's verbs work against it; a service killed
    under it is started again (after a backoff), on the same port, and the run says so; Ctrl-C (SIGINT)
    still stops everything."""
    root = stack_dir()
    cmd = [*CLI, "run", "--serve", "--nodes", "4", "--state-dir", str(root / "serve")]
    env = {"COLUMNS": "200", "PATH": "/usr/bin:/bin"}
    run = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    seen: list[str] = []

    def line_with(pattern: str, timeout_s: float) -> re.Match[str]:
        deadline = time.monotonic() + timeout_s
        assert run.stdout is not None
        while time.monotonic() < deadline:
            ready, _, _ = select.select([run.stdout], [], [], 1.0)
            if not ready:
                continue
            line = run.stdout.readline()
            if not line:
                break  # the run ended
            seen.append(line)
            if found := re.search(pattern, line):
                return found
        raise AssertionError(f"no line like {pattern!r} within {timeout_s} s:\n{''.join(seen)}")

    try:
        served = line_with(r"^scheduler\s+(http://\S+)\s+pid (\d+)", 180)
        url, pid = served.group(1), int(served.group(2))
        operate_from_the_cli(root / "serve")
        os.kill(pid, signal.SIGKILL)
        line_with(r"scheduler exited \(code -9\); starting it again in \d+ s", 30)
        again = int(line_with(r"scheduler started again \(pid (\d+)\)", 30).group(1))
        assert again != pid
        deadline = time.monotonic() + 60
        ready = False
        while not ready and time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(f"{url}/readyz", timeout=2) as r:
                    ready = r.status == 200
            time.sleep(0.5)
        assert ready, f"the scheduler started again did not answer {url}/readyz"
    finally:
        run.send_signal(signal.SIGINT)
        try:
            rest, _ = run.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            run.kill()
            rest, _ = run.communicate()
        shutil.rmtree(root, ignore_errors=True)
    assert "stack stopped" in rest, "".join(seen) + rest
    # The system's own checks judged, the demonstration's shown only (they depend on how long it served).
    assert "shown, not judged" in rest and run.returncode == 0, "".join(seen) + rest
