"""What a service loop survives: an outage of our infrastructure, and nothing else.

`OUTAGES` is the one tuple of exception types that mean "the bus or the store (or the network under
them) is away or refused for now": a loop catches it, logs it, counts it
(`ServiceMetrics.loop_failed`: `ibpool_loop_failures{loop, error}`) and tries again at its next
time. The classes, as the installed packages define them:

- the bus: `nats.errors.Error`, nats-py's base. JetStream's errors derive from it
  (`nats.js.errors.Error`: `APIError`, `NotFoundError`, `ServiceUnavailableError`, the key-value
  and object store errors), and so do `nats.errors.TimeoutError`, `NoServersError`,
  `ConnectionClosedError`, `ConnectionReconnectingError`, `StaleConnectionError`, ...;
- the store: asyncpg's `PostgresError` (every SQLSTATE error: a deadlock victim, a serialization
  failure, a statement timeout, the server shutting down; its connection errors,
  `PostgresConnectionError` and `ConnectionDoesNotExistError`, derive from it) and `InterfaceError`
  (a pool closing, a connection released or closed under the caller);
- `OSError`, with `ConnectionError` (refused, reset) and `ssl.SSLError`: a socket that failed;
- `TimeoutError`: a bounded wait that ran out (`asyncio.TimeoutError` is the same class since
  Python 3.11; nats-py's `TimeoutError` derives from both).

The two libraries' bases also hold a few misuses (nats-py's `BadSubjectError`, `MaxPayloadError`;
asyncpg's `DataError`, an argument of the wrong type, and an SQL error in our own statement): they
are kept whole so that no kind of outage is missed, and a loop that meets one logs and counts it.

A programming error (`KeyError`, `TypeError`, `AttributeError`, an `assert`, a `ValueError` from
our own code) is deliberately not in it: retrying a bug every tick would log it forever while the
loop does nothing useful. It ends the loop's task loudly; `Service` sees a task end with an error,
logs it and stops the service, and `run_service` exits non-zero so the orchestrator restarts it
(and somebody reads the traceback). Where a loop also means to survive bad input (a stored record
or a delivered message that does not decode), it names that input's error type next to this tuple,
at that site, with a comment.
"""

from __future__ import annotations

import asyncpg
import nats.errors

OUTAGES: tuple[type[Exception], ...] = (
    nats.errors.Error,
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    OSError,
    TimeoutError,
)
