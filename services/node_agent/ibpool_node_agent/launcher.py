"""The process launcher: a grant's command as a real process, with the grant's environment.

Each process gets its own session (so a stop reaches its children too), its own directory under
`work_dir` (`<key>/`, the key naming one node's part of an allocation, with `output.log` holding
stdout and stderr; deleted with the workload's row after `workload_retention_s`) and the agent's
environment plus the grant's (device visibility, MPS and HAMi-core limits). A stop sends SIGTERM
to the process group and SIGKILL after the grace period. Processes left by a previous run of the
agent are adopted by pid: they are watched until they are gone, their exit code unknown.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
from pathlib import Path

from ibpool_runtime.logs import get_logger
from ibpool_runtime.processes import process_alive

log = get_logger(__name__)


class LaunchError(Exception):
    """The command could not be started; the message says why."""


class ProcessLauncher:
    def __init__(self, work_dir: Path, stop_grace_s: float = 10.0) -> None:
        self.work_dir = work_dir
        self.stop_grace_s = stop_grace_s
        self.running: dict[str, asyncio.subprocess.Process] = {}
        self.adopted: dict[str, int] = {}
        self._kills: set[asyncio.Task[None]] = set()

    async def start(self, key: str, command: list[str], env: dict[str, str]) -> int:
        """Start `command`; its pid. LaunchError when it cannot start (no such file, not executable)."""
        if key in self.running:
            return self.running[key].pid
        where = self.dir_of(key)
        where.mkdir(parents=True, exist_ok=True)
        try:
            with (where / "output.log").open("ab") as out:
                proc = await asyncio.create_subprocess_exec(
                    *command,
                    cwd=where,
                    env={**os.environ, **env},
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=out,
                    stderr=asyncio.subprocess.STDOUT,
                    start_new_session=True,
                )
        except OSError as e:
            raise LaunchError(f"cannot start {command[0]!r}: {e.strerror or e}") from None
        except ValueError as e:  # an environment the OS refuses (a name with "=", a NUL byte)
            raise LaunchError(f"cannot start {command[0]!r}: {e}") from None
        self.running[key] = proc
        return proc.pid

    def dir_of(self, key: str) -> Path:
        """The directory of one workload; LaunchError for a key that would name one outside `work_dir`
        (keys come from grants on the bus)."""
        if not key or key in (".", "..") or "/" in key or "\\" in key or "\0" in key:
            raise LaunchError(f"work key {key!r} cannot name a directory under {self.work_dir}")
        return self.work_dir / key

    def remove_dirs(self, keys: list[str]) -> int:
        """Delete the directories (and output.log) of workloads gone from the agent's table; how many
        were there. Blocking: run it in a thread."""
        removed = 0
        for key in keys:
            try:
                where = self.dir_of(key)
            except LaunchError:
                continue
            if where.is_dir():
                shutil.rmtree(where, ignore_errors=True)
                removed += 1
        return removed

    def adopt(self, key: str, pid: int) -> bool:
        """Watch a process a previous agent started; False when it is already gone."""
        if not process_alive(pid):
            return False
        self.adopted[key] = pid
        return True

    def watches(self, key: str) -> bool:
        """Whether a process of this allocation is running (started here or adopted)."""
        return key in self.running or key in self.adopted

    def exited(self) -> list[tuple[str, int | None]]:
        """(allocation id, return code) of every process that ended since the last call; None: unknown."""
        out: list[tuple[str, int | None]] = []
        for alloc, proc in list(self.running.items()):
            if proc.returncode is not None:
                out.append((alloc, proc.returncode))
                del self.running[alloc]
        for alloc, pid in list(self.adopted.items()):
            if not process_alive(pid):
                out.append((alloc, None))
                del self.adopted[alloc]
        return out

    def stop(self, key: str) -> None:
        """SIGTERM its process group now, SIGKILL after the grace period; it is no longer reported."""
        proc = self.running.pop(key, None)
        pid = proc.pid if proc is not None else self.adopted.pop(key, None)
        if pid is None:
            return
        _signal_group(pid, signal.SIGTERM)
        task = asyncio.get_running_loop().create_task(self._kill_later(pid, proc))
        self._kills.add(task)
        task.add_done_callback(self._kills.discard)

    async def _kill_later(self, pid: int, proc: asyncio.subprocess.Process | None) -> None:
        if proc is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), self.stop_grace_s)
                return
        else:
            await asyncio.sleep(self.stop_grace_s)
        _signal_group(pid, signal.SIGKILL)


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
