"""`python -m ibpool_dashboard.screenshots docs/`: a screenshot of every dashboard page, taken from a
real system (`ibpool run --serve` on a small simulated cluster, the dashboard among its services)
in headless Chromium; `make docs` runs it. The browser test starts the system the same way
(`served`), so what the README shows is what is tested.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ibpool_runtime import devstack

from .browser import Chromium

# page -> (the route, what shows it has drawn its model)
PAGES: dict[str, tuple[str, str]] = {
    "overview": ("#/overview", "document.querySelector('[data-view=overview] [data-gpus]')"),
    "fabric": ("#/fabric", "document.querySelector('[data-view=fabric] [data-fabric-node]')"),
    "gpus": ("#/gpus", "document.querySelector('[data-view=gpus] [data-gpu]')"),
    "queue": ("#/queue", "document.querySelector('[data-view=queue]')"),
    "job": ("#/job/{job}", "document.querySelector('[data-view=job]')"),
    "nodes": ("#/nodes", "document.querySelector('[data-view=nodes] [data-node]')"),
    "events": ("#/events", "document.querySelector('[data-view=events] [data-event-type]')"),
}
SERVED_LINE = re.compile(r"^(\w+)\s+(http://\S+)\s+pid (\d+)")


@dataclass
class Served:
    """`ibpool run --serve`, once every service is up: their URLs and the operator's token."""

    proc: subprocess.Popen[str]
    state: Path
    urls: dict[str, str] = field(default_factory=dict)
    output: list[str] = field(default_factory=list)

    @property
    def token(self) -> str | None:
        info = devstack.read_info(self.state)
        return devstack.api_token(info) if info is not None else None

    def call(self, method: str, service: str, path: str, body: Any = None, token: str | None = "") -> Any:
        """An HTTP call to a service of the run (with the operator's token unless `token` is given)."""
        token = self.token if token == "" else token
        headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {token}"} if token else {})
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.urls[service] + path, data=data, method=method, headers=headers)
        with urllib.request.urlopen(request, timeout=30) as r:
            return json.loads(r.read() or b"null")


@contextlib.contextmanager
def served(nodes: int = 4, timeout_s: float = 180.0, insecure: bool = False) -> Iterator[Served]:
    """`ibpool run --serve --nodes N` in a fresh state folder until every service has printed its
    URL; stopped (SIGINT, as Ctrl-C) and its folder removed after."""
    root = Path(tempfile.mkdtemp(prefix="ibpool-dashboard-"))
    cmd = [sys.executable, "-m", "ibpool_cli", "run", "--serve", "--nodes", str(nodes), "--state-dir", str(root / "s")]
    cmd += ["--insecure"] if insecure else []
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"},
    )
    run = Served(proc=proc, state=root / "s")
    try:
        deadline = time.monotonic() + timeout_s
        assert proc.stdout is not None
        while True:  # until the last line of the list of services (postgres)
            if time.monotonic() > deadline:
                raise AssertionError(f"ibpool run --serve did not serve within {timeout_s} s:\n{''.join(run.output)}")
            ready, _, _ = select.select([proc.stdout], [], [], 1.0)
            if not ready:
                continue
            line = proc.stdout.readline()
            if not line:
                raise AssertionError(f"ibpool run --serve ended:\n{''.join(run.output)}")
            run.output.append(line)
            if found := SERVED_LINE.match(line):
                run.urls.setdefault(found.group(1), found.group(2))
            if line.startswith("postgres "):
                break
        for name, url in run.urls.items():  # listed once every node heartbeats; a service may start later
            while not _ready(url):
                if time.monotonic() > deadline:
                    raise AssertionError(f"{name} at {url} not ready within {timeout_s} s")
                time.sleep(0.2)
        yield run
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
        shutil.rmtree(root, ignore_errors=True)


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/readyz", timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False


GANG = {
    "id": "docs-gang",
    "tenant": "docs",
    "priority": 100,
    "hosts": 2,
    "gpus_per_host": 1,
    "workload": {"simulated_runtime_s": 900},
}


async def take(out: Path, nodes: int, settle_s: float) -> list[tuple[Path, int]]:
    """Every page of a small running system, as docs/dashboard-<page>.png."""
    shots: list[tuple[Path, int]] = []
    with served(nodes=nodes) as run:
        run.call("POST", "scheduler", "/v1/jobs", GANG)
        await asyncio.sleep(settle_s)  # some history for the overview's charts
        featured = _featured(run.call("GET", "scheduler", "/v1/jobs?live=true"))
        async with Chromium(width=1280, height=760) as browser:
            base = run.urls["dashboard"] + "/"
            await browser.open(base)
            for name, (route, ready) in PAGES.items():
                target = route.format(job=featured)
                if name == "fabric":
                    target += f"?job={featured}"
                await browser.open(base + target)
                await browser.wait_for(ready, f"the {name} page")
                await asyncio.sleep(0.3)  # let the fonts and a last refresh settle
                path = out / f"dashboard-{name}.png"
                await browser.screenshot(path)
                shots.append((path, await asyncio.to_thread(shrink, path)))
            if browser.problems:
                raise SystemExit("the pages reported errors:\n" + "\n".join(browser.problems))
    return shots


def _featured(jobs: list[dict[str, Any]]) -> str:
    """The job the job and fabric pages show: the running one on the most hosts (the run's own
    work fills the cluster differently each time), else the gang submitted for the docs."""
    running = [j for j in jobs if j["state"] == "running" and j["nodes"]]
    return str(max(running, key=lambda j: len(j["nodes"]))["job_id"]) if running else str(GANG["id"])


def shrink(path: Path, colors: int = 128) -> int:
    """Rewrite the PNG at `path` with a palette of `colors` (flat UI colours and text survive it; a
    page is a quarter of the size); its size in bytes."""
    from PIL import Image  # Pillow (matplotlib's, through ibpool-sim); only the docs need it

    with Image.open(path) as shot:
        small = shot.convert("RGB").quantize(colors=colors, method=Image.Quantize.FASTOCTREE, dither=Image.Dither.NONE)
    small.save(path, optimize=True)
    return path.stat().st_size


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ibpool_dashboard.screenshots", description=__doc__)
    p.add_argument("out", type=Path, help="the folder the PNGs go to (docs/)")
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--settle", type=float, default=12.0, help="seconds the system runs before the shots")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for path, size in asyncio.run(take(args.out, args.nodes, args.settle)):
        print(f"{path}: {size // 1024} KiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
