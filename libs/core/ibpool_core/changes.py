"""What changed since a reader looked: `ChangeLog`, the one change log of the core's kept structures
(the scheduler's live jobs, telemetry, the pool ledger's nodes and allocations), so that a reader
does the work of the changes, not a walk over everything."""

from __future__ import annotations

__all__ = ["ChangeLog"]


class ChangeLog:
    """The keys changed since a reader looked: `changes_since(token, version)` gives them (oldest
    first, repeats kept), or None when the reader must read whole what the log is of (another log,
    one `reset` since, or a past the log no longer holds: it keeps its newer half past `KEEP` entries
    and past `size`, the size of what it is of)."""

    KEEP = 4096

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.token = object()
        self._log: list[str] = []
        self._base = 0

    @property
    def version(self) -> int:
        return self._base + len(self._log)

    def changes_since(self, token: object, version: int) -> list[str] | None:
        if token is not self.token or version < self._base or version > self.version:
            return None
        return self._log[version - self._base :]

    def note(self, key: str, size: int) -> None:
        log = self._log
        log.append(key)
        if len(log) > max(self.KEEP, size):
            half = len(log) // 2
            del log[:half]
            self._base += half
