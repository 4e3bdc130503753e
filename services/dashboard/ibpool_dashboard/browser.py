"""A headless Chromium driven over the DevTools protocol (CDP, a websocket, with aiohttp): what the
dashboard's browser test and `make docs`' screenshots open the pages with.

It collects what a page did wrong as it happened: uncaught exceptions (`Runtime.exceptionThrown`),
`console.error` calls and the browser's own error log entries (a failed request, a CSP refusal:
`Log.entryAdded`). `wait_for` polls a JavaScript expression until it is truthy, within a bound, and
fails naming what it waited for. Debian's `chromium` package is what it is tested with.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import os
import shutil
import signal
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import aiohttp

BINARIES = ("chromium", "chromium-browser", "google-chrome", "chrome")


class BrowserMissing(Exception):
    """No Chromium here (Debian: `apt-get install chromium`)."""


def find_chromium() -> str | None:
    """The Chromium to use: IBPOOL_CHROMIUM (None when it names no program), else the first of BINARIES
    on the PATH."""
    named = os.environ.get("IBPOOL_CHROMIUM")
    if named:
        return shutil.which(named)
    return next((found for b in BINARIES if (found := shutil.which(b))), None)


class Chromium:
    """`async with Chromium() as browser:` one headless browser with one page (a tab)."""

    def __init__(self, width: int = 1280, height: int = 800, start_timeout_s: float = 30.0) -> None:
        self.width, self.height, self.start_timeout_s = width, height, start_timeout_s
        self.problems: list[str] = []
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._events: dict[str, list[asyncio.Future[dict[str, Any]]]] = {}
        self._proc: asyncio.subprocess.Process | None = None
        self._profile: tempfile.TemporaryDirectory[str] | None = None
        self._http: aiohttp.ClientSession | None = None
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._reader: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Chromium:
        binary = find_chromium()
        if binary is None:
            raise BrowserMissing(
                f"no Chromium found (looked for {', '.join(BINARIES)}; Debian: apt-get install chromium)"
            )
        # Its helper processes may still be writing the profile as they go: cleaned up after they are.
        self._profile = tempfile.TemporaryDirectory(prefix="ibpool-chromium-", ignore_cleanup_errors=True)
        profile = Path(self._profile.name)
        argv = [
            binary,
            "--headless=new",
            "--disable-gpu",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-extensions",
            "--disable-dev-shm-usage",
            "--remote-debugging-port=0",
            f"--user-data-dir={profile}",
            f"--window-size={self.width},{self.height}",
            "about:blank",
        ]
        if os.geteuid() == 0:
            argv.insert(1, "--no-sandbox")  # Chromium refuses to run as root with its sandbox
        # A session of its own: the browser and every helper process it starts end together (`__aexit__`).
        self._proc = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL, start_new_session=True
        )
        try:
            await self._connect(profile / "DevToolsActivePort")
        except BaseException:
            await self.__aexit__(None, None, None)
            raise
        return self

    async def _connect(self, port_file: Path) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        while (port := await asyncio.to_thread(_devtools_port, port_file)) is None:
            assert self._proc is not None
            if self._proc.returncode is not None:
                raise BrowserMissing(f"chromium exited with {self._proc.returncode} before it listened")
            if time.monotonic() > deadline:
                raise BrowserMissing(f"chromium did not listen within {self.start_timeout_s} s")
            await asyncio.sleep(0.1)
        self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
        async with self._http.get(f"http://127.0.0.1:{port}/json/list") as r:
            targets = await r.json()
        page = next(t for t in targets if t.get("type") == "page")
        self._ws = await self._http.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=64 << 20)
        self._reader = asyncio.create_task(self._read())
        for domain in ("Page", "Runtime", "Log"):
            await self.send(f"{domain}.enable")
        await self.send(
            "Emulation.setDeviceMetricsOverride",
            width=self.width,
            height=self.height,
            deviceScaleFactor=1,
            mobile=False,
        )

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader
        if self._ws is not None:
            await self._ws.close()
        if self._http is not None:
            await self._http.close()
        if self._proc is not None:
            await _end_group(self._proc)
        if self._profile is not None:
            self._profile.cleanup()

    async def _read(self) -> None:
        assert self._ws is not None
        async for msg in self._ws:
            if msg.type != aiohttp.WSMsgType.TEXT:
                continue
            data = msg.json()
            if "id" in data:
                waiting = self._waiting.pop(data["id"], None)
                if waiting is not None and not waiting.done():
                    waiting.set_result(data)
                continue
            self._note(data.get("method", ""), data.get("params", {}))
            for f in self._events.pop(data.get("method", ""), []):
                if not f.done():
                    f.set_result(data.get("params", {}))

    def _note(self, method: str, params: dict[str, Any]) -> None:
        """What the page did wrong, as the page's author would want to hear it."""
        if method == "Runtime.exceptionThrown":
            d = params.get("exceptionDetails", {})
            text = (d.get("exception") or {}).get("description") or d.get("text", "")
            self.problems.append(f"exception: {text} at {d.get('url', '')}:{d.get('lineNumber', '')}")
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            args = " ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", []))
            self.problems.append(f"console.{params['type']}: {args}")
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
            e = params["entry"]
            self.problems.append(f"log ({e.get('source', '')}): {e.get('text', '')} {e.get('url', '')}".rstrip())

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        assert self._ws is not None
        n = next(self._ids)
        answer: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[n] = answer
        await self._ws.send_json({"id": n, "method": method, "params": params})
        data = await asyncio.wait_for(answer, timeout=30)
        if "error" in data:
            raise RuntimeError(f"{method}: {data['error'].get('message', data['error'])}")
        result: dict[str, Any] = data.get("result", {})
        return result

    def _next_event(self, method: str) -> asyncio.Future[dict[str, Any]]:
        f: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._events.setdefault(method, []).append(f)
        return f

    async def open(self, url: str, timeout_s: float = 20.0) -> None:
        """Go to `url` and wait for its load event (none comes when only the fragment changes)."""
        loaded = self._next_event("Page.loadEventFired")
        answer = await self.send("Page.navigate", url=url)
        if answer.get("errorText"):
            raise AssertionError(f"{url} did not load: {answer['errorText']}")
        if answer.get("loaderId"):  # a new document, not a move within the same one
            await asyncio.wait_for(loaded, timeout=timeout_s)

    async def evaluate(self, expression: str) -> Any:
        answer = await self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in answer:
            raise AssertionError(f"{expression}: {answer['exceptionDetails'].get('text', '')}")
        return answer.get("result", {}).get("value")

    async def wait_for(self, expression: str, what: str, timeout_s: float = 20.0) -> Any:
        """The value of `expression` once it is truthy; AssertionError naming `what` after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        last: Any = None
        wrapped = f"(v => v instanceof Node ? true : v)({expression})"  # an element has no JSON value
        while time.monotonic() < deadline:
            last = await self.evaluate(wrapped)
            if last:
                return last
            await asyncio.sleep(0.1)
        page = await self.evaluate("document.body ? document.body.innerText.slice(0, 1500) : ''")
        raise AssertionError(f"{what}: not seen within {timeout_s} s (last value {last!r}); the page shows:\n{page}")

    async def screenshot(self, path: Path) -> int:
        """A PNG of the viewport into `path`; its size in bytes."""
        shot = await self.send("Page.captureScreenshot", format="png")
        data = base64.b64decode(shot["data"])
        await asyncio.to_thread(path.write_bytes, data)
        return len(data)


def _devtools_port(port_file: Path) -> str | None:
    """The port Chromium wrote once it listens (`--remote-debugging-port=0`), or None yet."""
    try:
        lines = port_file.read_text().splitlines()
    except FileNotFoundError:
        return None
    return lines[0].strip() if len(lines) >= 2 else None


async def _end_group(proc: asyncio.subprocess.Process) -> None:
    """End the browser and its helpers (its process group): SIGTERM, then SIGKILL after 10 s, and wait
    until no process of the group is left (they write the profile until they are gone)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        await asyncio.wait_for(proc.wait(), timeout=10)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()
    for _ in range(50):  # the helpers a moment after the browser
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return
        await asyncio.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
