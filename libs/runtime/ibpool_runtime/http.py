"""The HTTP side of a service: /healthz, /readyz, /metrics, its own routes, and clear 4xx errors.

Bodies are ibpool_proto Structs: `await read_body(request, Type)` answers 400 with msgspec's
error path (`$.gpus[0].memory_mib`) when the JSON is bad or does not validate, and 415 unless the
request says `Content-Type: application/json` (so a browser's cross-origin "simple" POST, which
cannot, never reaches a handler). Bodies are capped at MAX_BODY_BYTES (413). A method a path does
not take answers 405 with `Allow` naming those it does (RFC 9110).

Bearer tokens (`ApiAuth`, on when `api_tokens_file` is set): each token has a role. `operator`
may do everything; `client` (a scheduler, an autoscaler, a user's tool) may change state except
under the operator-only paths (quotas, fault injection); `readonly` may read. Reads are open
unless `api_protect_reads`; /healthz, /readyz, /metrics and /openapi.json always are. Tokens are kept as
SHA-256 digests and compared in constant time against every known digest.

Every service publishes an OpenAPI 3.1 document at /openapi.json, generated from its routes: a
handler declares its body, query parameters and responses with `@documented(...)`, and the JSON
Schemas come from msgspec. A route without the declaration is listed with `x-undocumented`.

Text Postgres cannot store (a NUL character) is refused at the door: 404 in the path, 400 naming
the query parameter or the body field.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path
from typing import Annotated, Any, TypeVar

import msgspec
from aiohttp import web
from aiohttp.typedefs import Middleware
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from .config import BaseConfig, ConfigError
from .logs import get_logger
from .metrics import ServiceMetrics
from .outages import OUTAGES

log = get_logger(__name__)

T = TypeVar("T")
MAX_BODY_BYTES = 1 << 20
# An id a client chooses (a job's, an allocation's): it names NATS subjects and URL paths, so only
# letters, digits, `_` and `-` (no `.`, `*`, `>`, `/`, spaces).
SafeId = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9_-]{1,128}$")]
# A GPU's index on its node, as NVML numbers them (a path parameter of the node APIs).
GpuIndex = Annotated[int, msgspec.Meta(ge=0, le=1023)]

Readiness = Callable[[], Awaitable[dict[str, bool]]]
RefreshMetrics = Callable[[], Awaitable[None]]


class ErrorBody(msgspec.Struct, frozen=True, kw_only=True):
    error: str
    detail: str = ""
    path: str | None = None


def json_response(body: Any, status: int = 200) -> web.Response:
    return web.Response(body=msgspec.json.encode(body), status=status, content_type="application/json")


def _error(status: int, error: str, detail: str = "", path: str | None = None) -> web.Response:
    """An ErrorBody; what it quotes of the request (an unknown field's name, a value) is escaped where it
    holds text no document allows (NUL, a lone surrogate)."""
    shown = None if path is None else _printable(path)
    return json_response(ErrorBody(error=error, detail=_printable(detail), path=shown), status=status)


def _printable(text: str) -> str:
    return ascii(text)[1:-1] if _unstorable(text) else text


class UnsupportedMediaType(Exception):
    """A request body that is not declared as JSON; answered with 415."""


class BadBody(Exception):
    """A request body that is not valid JSON or not the expected Struct; answered with 400."""

    def __init__(self, detail: str, path: str | None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.path = path


class Unprocessable(BadBody):
    """A body that fits its schema (the OpenAPI document) but whose values do not add up (fields
    that contradict each other, a value the cluster cannot have); answered with 422 (RFC 9110)."""


async def read_body(request: web.Request, body_type: type[T]) -> T:
    """Decode and validate a JSON body as `body_type`; 400 naming the bad field otherwise, 415
    when the request does not declare it as JSON."""
    if request.content_type != "application/json":
        raise UnsupportedMediaType(request.headers.get("Content-Type", ""))
    raw = await request.read()
    try:
        document = msgspec.json.decode(raw)
    except msgspec.DecodeError as e:
        raise BadBody(f"malformed JSON: {e}", None) from None
    try:
        value = msgspec.convert(_integral_floats(document), body_type)
    except msgspec.ValidationError as e:
        text = str(e)
        path = text.split("at `", 1)[1].rstrip("`") if "at `" in text else None
        raise BadBody(text, path) from None
    # What the type keeps (fields it does not know are dropped) must be text Postgres can store.
    where = _unstorable_text_at(msgspec.to_builtins(value), "$")
    if where is not None:
        raise BadBody(f"text must be UTF-8 without NUL characters, at `{where}`", where)
    return value


def _integral_floats(value: Any) -> Any:
    """JSON numbers with no fraction as ints (JSON Schema's "integer" includes 2.0; msgspec's int does
    not), everywhere in a decoded document; a float field still takes them."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _integral_floats(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_integral_floats(v) for v in value]
    return value


# What `_unstorable` refuses, as a JSON Schema pattern: every string of every document carries it.
# It says NUL only: a pattern cannot name lone surrogates portably (JSON Schema validators in
# languages whose strings cannot hold them reject such a pattern); they are refused all the same.
STORABLE_TEXT = r"^[^\u0000]*$"


def _unstorable(text: str) -> bool:
    """Text Postgres cannot store (a NUL, a lone surrogate): no name, id or label of ours has one
    (`STORABLE_TEXT` says the same in the OpenAPI documents)."""
    if "\x00" in text:
        return True
    try:
        text.encode()
    except UnicodeEncodeError:
        return True
    return False


def _parameter_problem(request: web.Request, doc: ApiDoc) -> web.Response | None:
    """A 400 for a path or query parameter that does not fit the type its handler declares (the
    type the OpenAPI document shows), before the handler runs; None when all fit."""
    for name, t in doc.path.items():
        try:
            msgspec.convert(request.match_info.get(name), t, strict=False)
        except msgspec.ValidationError as e:
            return _error(400, "invalid path parameter", f"{name}: {e}", f"{{{name}}}")
    for name, t in doc.query.items():
        if name not in request.query:
            continue
        try:
            msgspec.convert(request.query[name], t, strict=False)
        except msgspec.ValidationError as e:
            return _error(400, "invalid query parameter", f"{name}: {e}", f"?{name}")
    return None


def _unstorable_text_at(value: Any, path: str) -> str | None:
    """The path of the first string (or key) in a decoded body that Postgres cannot store."""
    if isinstance(value, str):
        return path if _unstorable(value) else None
    if isinstance(value, dict):
        for k, v in value.items():
            if isinstance(k, str) and _unstorable(k):
                return path
            found = _unstorable_text_at(v, f"{path}.{k}")
            if found is not None:
                return found
    elif isinstance(value, list):
        for i, v in enumerate(value):
            found = _unstorable_text_at(v, f"{path}[{i}]")
            if found is not None:
                return found
    return None


def _errors_middleware(metrics: ServiceMetrics) -> Middleware:
    """Clear 4xx answers for what a client got wrong, and a 500 for anything else a handler raised
    (counted in `ibpool_loop_failures{loop="http"}`)."""

    @web.middleware
    async def errors(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        return await _errors(request, handler, metrics)

    return errors


async def _errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]], metrics: ServiceMetrics
) -> web.StreamResponse:
    if _unstorable(request.path):
        return _error(404, "not found", "no resource name has a NUL character")
    for key, value in request.query.items():
        if _unstorable(key) or _unstorable(value):
            return _error(400, "invalid query parameter", "query parameters may not have NUL characters", f"?{key}")
    doc = getattr(request.match_info.route.handler, "__ibpool_api__", None)
    if isinstance(doc, ApiDoc):
        problem = _parameter_problem(request, doc)
        if problem is not None:
            return problem
    try:
        return await handler(request)
    except Unprocessable as e:
        return _error(422, "unprocessable request body", e.detail, e.path)
    except BadBody as e:
        # A handler's own check of a query parameter names it as "?name": the body is not at fault.
        what = "invalid query parameter" if e.path is not None and e.path.startswith("?") else "invalid request body"
        return _error(400, what, e.detail, e.path)
    except UnsupportedMediaType as e:
        got = f"got {str(e)!r}" if str(e) else "got none"
        return _error(415, "unsupported media type", f"send the body as Content-Type: application/json ({got})")
    except web.HTTPNotFound:
        return _error(404, "not found", f"no route for {request.method} {request.path}")
    except web.HTTPMethodNotAllowed as e:
        allowed = sorted(e.allowed_methods)
        response = _error(405, "method not allowed", f"{request.method} {request.path}; allowed: {allowed}")
        response.headers["Allow"] = ", ".join(allowed)
        return response
    except web.HTTPRequestEntityTooLarge:
        return _error(413, "request body too large", f"limit is {MAX_BODY_BYTES} bytes")
    except web.HTTPException:
        raise
    except Exception as e:
        # Any error: a request must be answered (500 naming the error class), and one request's bug
        # or the store away must not take the server down; logged with its traceback, and counted.
        metrics.loop_failed("http", e)
        log.exception("unhandled error in HTTP handler", path=request.path)
        return _error(500, "internal error", type(e).__name__)


ROLES = ("operator", "client", "readonly")
OPEN_PATHS = ("/healthz", "/readyz", "/metrics", "/openapi.json")
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
            text = path.read_bytes().decode()
        except OSError as e:
            raise ConfigError(f"field `api_tokens_file`: cannot read {path}: {e.strerror or e}") from None
        except UnicodeDecodeError as e:
            raise ConfigError(f"field `api_tokens_file`: {path} is not UTF-8 (byte {e.start}): {e.reason}") from None
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
        """The role of the token in an `Authorization` header; the scheme is matched without regard
        to case (RFC 7235: `Bearer`, `bearer`, `BEARER`)."""
        scheme, _, token = (header or "").strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return None
        presented = _digest(token)
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


H = TypeVar("H", bound=Callable[..., Any])
NO_BODY = None
"""A response without a body (`responses={204: NO_BODY}`)."""


@dataclass(frozen=True)
class ApiDoc:
    """What a handler takes and answers, for the OpenAPI document. Response values are types
    msgspec can describe (Structs, lists, dicts, Any) or NO_BODY; errors are ErrorBody."""

    summary: str
    responses: Mapping[int, Any]
    body: Any = None
    query: Mapping[str, Any] = field(default_factory=dict)
    required_query: tuple[str, ...] = ()
    content_type: str = "application/json"
    # Path parameter -> its type (default: any string); checked before the handler runs (400 if not).
    path: Mapping[str, Any] = field(default_factory=dict)


def documented(
    summary: str,
    responses: Mapping[int, Any],
    *,
    body: Any = None,
    query: Mapping[str, Any] | None = None,
    required_query: Sequence[str] = (),
    content_type: str = "application/json",
    path: Mapping[str, Any] | None = None,
) -> Callable[[H], H]:
    """Declare a handler's request and responses; the route table stays aiohttp's own.

    `path` gives path parameters a type (e.g. `SafeId`): the document carries its constraints and a
    request whose parameter does not fit is answered 400 before the handler runs, so the document
    and the code hold one rule. 400 (with a body, query or typed path parameters), 404 (with path
    parameters), 413 (with a body) and 401/403 (when the API needs a token for the call) are added
    as ErrorBody responses."""
    doc = ApiDoc(
        summary, dict(responses), body, dict(query or {}), tuple(required_query), content_type, dict(path or {})
    )

    def mark(handler: H) -> H:
        handler.__ibpool_api__ = doc  # type: ignore[attr-defined]
        return handler

    return mark


STRING = {"type": "string"}
_PATH_PARAM = re.compile(r"\{([^}:]+)(?::[^}]*)?\}")


def openapi_document(app: web.Application, title: str, auth: ApiAuth | None = None) -> dict[str, Any]:
    """The OpenAPI 3.1 document of `app`'s routes (HEAD routes left out)."""
    ops: list[tuple[str, str, list[str], ApiDoc | None]] = []
    for route in app.router.routes():
        if route.method in ("HEAD", "*") or route.resource is None:
            continue
        path = route.resource.canonical
        doc = getattr(route.handler, "__ibpool_api__", None)
        ops.append((path, route.method.lower(), _PATH_PARAM.findall(path), doc))
    types: list[Any] = [ErrorBody]
    for _, _, _, doc in ops:
        if doc is not None:
            types.extend(doc.query.values())
            types.extend(doc.path.values())
            types.extend(t for t in doc.responses.values() if t is not NO_BODY)
            types.extend([doc.body] if doc.body is not None else [])
    schemas, components = msgspec.json.schema_components(
        types, schema_hook=_any_object, ref_template="#/components/schemas/{name}"
    )
    schema_of = dict(zip(map(repr, types), schemas, strict=True))
    error_content = {"application/json": {"schema": schema_of[repr(ErrorBody)]}}
    paths: dict[str, dict[str, Any]] = {}
    for path, method, params, doc in ops:
        op: dict[str, Any] = {"operationId": f"{method}{path}".replace("/", "_").replace("{", "").replace("}", "")}
        typed = doc.path if doc is not None else {}
        parameters = [
            {"name": p, "in": "path", "required": True, "schema": schema_of[repr(typed[p])] if p in typed else STRING}
            for p in params
        ]
        responses: dict[str, Any] = {}
        errors: dict[int, str] = {}
        if doc is None:
            op["x-undocumented"] = True
            responses["default"] = {"description": "not documented"}
        else:
            op["summary"] = doc.summary
            for name, t in doc.query.items():
                required = name in doc.required_query
                parameters.append({"name": name, "in": "query", "required": required, "schema": schema_of[repr(t)]})
            for status, t in sorted(doc.responses.items()):
                if t is NO_BODY:
                    responses[str(status)] = {"description": _reason(status)}
                elif status >= 400 and t is ErrorBody:
                    errors[status] = _reason(status)
                else:
                    media = doc.content_type if status < 400 else "application/json"
                    content = {media: {"schema": schema_of[repr(t)]}}
                    responses[str(status)] = {"description": _reason(status), "content": content}
            if doc.body is not None:
                body_content = {"application/json": {"schema": schema_of[repr(doc.body)]}}
                op["requestBody"] = {"required": True, "content": body_content}
                errors.setdefault(400, "invalid request body")
                errors.setdefault(413, "request body too large")
                errors.setdefault(415, "the body is not declared as application/json")
                errors.setdefault(422, "the body fits its schema but its values do not add up")
            if doc.query:
                errors.setdefault(400, "invalid query parameter")
            if doc.path:
                errors.setdefault(400, "invalid path parameter")
        if params:
            errors.setdefault(404, "not found")
        if auth is not None and auth.allowed(method.upper(), path):
            op["security"] = [{"bearer": []}]
            errors.setdefault(401, "no or unknown token")
            errors.setdefault(403, "the token's role may not make this call")
        for status, description in errors.items():
            responses.setdefault(str(status), {"description": description, "content": error_content})
        if parameters:
            op["parameters"] = parameters
        op["responses"] = dict(sorted(responses.items()))
        paths.setdefault(path, {})[method] = op
    document: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {"title": title, "version": "1"},
        "paths": paths,
        "components": {"schemas": components},
    }
    _storable_strings(document)
    if auth is not None:
        document["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    return document


def _storable_strings(node: Any) -> None:
    """Every string a document describes (values, and the keys of free-form objects) may not hold
    what the APIs refuse as unstorable text; a string with its own pattern or format keeps it."""
    if isinstance(node, list):
        for item in node:
            _storable_strings(item)
        return
    if not isinstance(node, dict):
        return
    kind = node.get("type")
    is_string = kind == "string" or (isinstance(kind, list) and "string" in kind)
    if is_string and not {"pattern", "format", "enum", "const"} & node.keys():
        node["pattern"] = STORABLE_TEXT
    is_object = kind == "object" or (isinstance(kind, list) and "object" in kind)
    if is_object and node.get("additionalProperties", True) is not False and "propertyNames" not in node:
        node["propertyNames"] = {"pattern": STORABLE_TEXT}
    for value in node.values():
        _storable_strings(value)


def _any_object(t: Any) -> dict[str, Any]:
    if t is object:  # `dict[str, object]`
        return {"description": "any JSON value"}
    raise NotImplementedError(t)


def _reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return str(status)


class _Health(msgspec.Struct, frozen=True, kw_only=True):
    status: str


class _Ready(msgspec.Struct, frozen=True, kw_only=True):
    ready: bool
    checks: dict[str, bool]


def create_app(
    metrics: ServiceMetrics,
    readiness: Readiness,
    refresh_metrics: RefreshMetrics | None = None,
    add_routes: Callable[[web.Application], object] | None = None,
    auth: ApiAuth | None = None,
    title: str = "ibpool service",
) -> web.Application:
    errors = _errors_middleware(metrics)
    middlewares = [errors] if auth is None else [errors, _auth_middleware(auth)]
    app = web.Application(middlewares=middlewares, client_max_size=MAX_BODY_BYTES)

    @documented("Liveness", {200: _Health})
    async def healthz(_: web.Request) -> web.Response:
        return json_response(_Health(status="alive"))

    @documented("Readiness: the bus, the store and the consumers", {200: _Ready, 503: _Ready})
    async def readyz(_: web.Request) -> web.Response:
        checks = await readiness()
        ready = all(checks.values())
        return json_response(_Ready(ready=ready, checks=checks), status=200 if ready else 503)

    @documented("Prometheus metrics", {200: str}, content_type=CONTENT_TYPE_LATEST.split(";")[0])
    async def metrics_text(_: web.Request) -> web.Response:
        if refresh_metrics is not None:
            try:
                await refresh_metrics()
            except OUTAGES as e:  # a scrape must not fail because the bus or the store could not refresh a gauge
                metrics.loop_failed("metrics refresh", e)
                log.warning("metrics refresh failed", error=str(e) or type(e).__name__)
        return web.Response(body=generate_latest(metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_text)
    if add_routes is not None:
        add_routes(app)
    document: dict[str, Any] | None = None

    @documented("This OpenAPI document", {200: dict[str, Any]})
    async def openapi(_: web.Request) -> web.Response:
        nonlocal document
        if document is None:  # built on first use: every route is registered by then
            document = openapi_document(app, title, auth)
        return json_response(document)

    app.router.add_get("/openapi.json", openapi)
    return app
