"""The HTTP side of a service: /healthz, /readyz, /metrics, its own routes, and clear 4xx errors.

Bodies are ibpool_proto Structs: `await read_body(request, Type)` answers 400 with msgspec's
error path (`$.gpus[0].memory_mib`) when the JSON is bad or does not validate.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import msgspec
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from .logs import get_logger
from .metrics import ServiceMetrics

log = get_logger(__name__)

T = TypeVar("T")
MAX_BODY_BYTES = 1 << 20

Readiness = Callable[[], Awaitable[dict[str, bool]]]
RefreshMetrics = Callable[[], Awaitable[None]]


class ErrorBody(msgspec.Struct, frozen=True, kw_only=True):
    error: str
    detail: str = ""
    path: str | None = None


def json_response(body: Any, status: int = 200) -> web.Response:
    return web.Response(body=msgspec.json.encode(body), status=status, content_type="application/json")


def _error(status: int, error: str, detail: str = "", path: str | None = None) -> web.Response:
    return json_response(ErrorBody(error=error, detail=detail, path=path), status=status)


class BadBody(Exception):
    """A request body that is not valid JSON or not the expected Struct; answered with 400."""

    def __init__(self, detail: str, path: str | None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.path = path


async def read_body(request: web.Request, body_type: type[T]) -> T:
    """Decode and validate a JSON body as `body_type`; 400 naming the bad field otherwise."""
    raw = await request.read()
    try:
        return msgspec.json.decode(raw, type=body_type)
    except msgspec.ValidationError as e:
        text = str(e)
        path = text.split("at `", 1)[1].rstrip("`") if "at `" in text else None
        raise BadBody(text, path) from None
    except msgspec.DecodeError as e:
        raise BadBody(f"malformed JSON: {e}", None) from None


@web.middleware
async def _errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    try:
        return await handler(request)
    except BadBody as e:
        return _error(400, "invalid request body", e.detail, e.path)
    except web.HTTPNotFound:
        return _error(404, "not found", f"no route for {request.method} {request.path}")
    except web.HTTPMethodNotAllowed as e:
        return _error(
            405, "method not allowed", f"{request.method} {request.path}; allowed: {sorted(e.allowed_methods)}"
        )
    except web.HTTPRequestEntityTooLarge:
        return _error(413, "request body too large", f"limit is {MAX_BODY_BYTES} bytes")
    except web.HTTPException:
        raise
    except Exception as e:
        log.exception("unhandled error in HTTP handler", path=request.path)
        return _error(500, "internal error", type(e).__name__)


def create_app(
    metrics: ServiceMetrics,
    readiness: Readiness,
    refresh_metrics: RefreshMetrics | None = None,
    add_routes: Callable[[web.Application], None] | None = None,
) -> web.Application:
    app = web.Application(middlewares=[_errors], client_max_size=MAX_BODY_BYTES)

    async def healthz(_: web.Request) -> web.Response:
        return json_response({"status": "alive"})

    async def readyz(_: web.Request) -> web.Response:
        checks = await readiness()
        ready = all(checks.values())
        return json_response({"ready": ready, "checks": checks}, status=200 if ready else 503)

    async def metrics_text(_: web.Request) -> web.Response:
        if refresh_metrics is not None:
            try:
                await refresh_metrics()
            except Exception as e:  # a scrape must not fail because a gauge could not refresh
                log.warning("metrics refresh failed", error=str(e))
        return web.Response(body=generate_latest(metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_text)
    if add_routes is not None:
        add_routes(app)
    return app
