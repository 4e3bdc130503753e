"""The HTTP side of a service: /healthz, /readyz, /metrics, its own routes, and clear 4xx errors.

Bodies are ibpool_proto Structs: `await read_body(request, Type)` answers 400 with msgspec's
error path (`$.gpus[0].memory_mib`) when the JSON is bad or does not validate. Bodies are capped
at MAX_BODY_BYTES (413).

Bearer tokens (`ApiAuth`, on when `api_tokens_file` is set): each token has a role. `operator`
may do everything; `client` (a scheduler, an autoscaler, a user's tool) may change state except
under the operator-only paths (quotas, fault injection); `readonly` may read. Reads are open
unless `api_protect_reads`; /healthz, /readyz and /metrics always are. Tokens are kept as
SHA-256 digests and compared in constant time against every known digest.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import msgspec
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from .config import BaseConfig, ConfigError
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


ROLES = ("operator", "client", "readonly")
OPEN_PATHS = ("/healthz", "/readyz", "/metrics")
MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE"})


class ApiAuth:
    """Who may call what: token digests with their roles, and which paths only operators may change."""

    def __init__(self, roles: dict[str, str], protect_reads: bool, operator_paths: Sequence[str]) -> None:
        self.roles = roles  # SHA-256 hex digest of a token -> role
        self.protect_reads = protect_reads
        self.operator_paths = tuple(operator_paths)

    @classmethod
    def from_config(cls, cfg: BaseConfig) -> ApiAuth | None:
        """None (an open API) when no tokens file is configured; ConfigError naming the file and line."""
        if not cfg.api_tokens_file:
            return None
        path = Path(cfg.api_tokens_file)
        try:
            text = path.read_text()
        except OSError as e:
            raise ConfigError(f"field `api_tokens_file`: cannot read {path}: {e.strerror or e}") from None
        roles: dict[str, str] = {}
        for n, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            role, _, token = line.partition(" ")
            token = token.strip()
            if role not in ROLES or not token:
                raise ConfigError(f"{path}:{n}: expected '<{'|'.join(ROLES)}> <token>', got {role!r}")
            digest = token.removeprefix("sha256:") if token.startswith("sha256:") else _digest(token)
            roles[digest] = role
        if not roles:
            raise ConfigError(f"{path}: no tokens (lines '<role> <token>')")
        paths = [p.strip() for p in cfg.api_operator_paths.split(",") if p.strip()]
        return cls(roles, cfg.api_protect_reads, paths)

    def role_of(self, header: str | None) -> str | None:
        if not header or not header.startswith("Bearer "):
            return None
        presented = _digest(header.removeprefix("Bearer ").strip())
        found = None
        for digest, role in self.roles.items():  # every digest compared, so timing says nothing
            if hmac.compare_digest(digest, presented):
                found = role
        return found

    def allowed(self, method: str, path: str) -> tuple[str, ...]:
        """The roles that may make this call; () when it is open."""
        if path in OPEN_PATHS:
            return ()
        if method in MUTATING:
            if any(path.startswith(p) for p in self.operator_paths):
                return ("operator",)
            return ("operator", "client")
        return ROLES if self.protect_reads else ()


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _auth_middleware(auth: ApiAuth):  # type: ignore[no-untyped-def]
    @web.middleware
    async def check(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        allowed = auth.allowed(request.method, request.path)
        if allowed:
            role = auth.role_of(request.headers.get("Authorization"))
            if role is None:
                response = _error(401, "unauthorized", "send 'Authorization: Bearer <token>'")
                response.headers["WWW-Authenticate"] = 'Bearer realm="ibpool"'
                return response
            if role not in allowed:
                return _error(403, "forbidden", f"role {role} may not {request.method} {request.path}")
        return await handler(request)

    return check


def create_app(
    metrics: ServiceMetrics,
    readiness: Readiness,
    refresh_metrics: RefreshMetrics | None = None,
    add_routes: Callable[[web.Application], None] | None = None,
    auth: ApiAuth | None = None,
) -> web.Application:
    middlewares = [_errors] if auth is None else [_errors, _auth_middleware(auth)]
    app = web.Application(middlewares=middlewares, client_max_size=MAX_BODY_BYTES)

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
