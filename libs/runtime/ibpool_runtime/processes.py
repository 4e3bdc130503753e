"""Is a process still there? For servers the dev stack started and work a node agent adopted."""

from __future__ import annotations

import contextlib
import os


def process_alive(pid: int) -> bool:
    """True while `pid` runs (or belongs to another user); a zombie child of ours is reaped and counts as gone."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(ChildProcessError):
        if os.waitpid(pid, os.WNOHANG) != (0, 0):
            return False
    return True
