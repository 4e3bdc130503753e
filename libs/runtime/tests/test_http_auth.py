"""Bearer tokens on a real HTTP server (aiohttp's test server on loopback): roles, open paths, bad files."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from ibpool_runtime.config import BaseConfig, ConfigError
from ibpool_runtime.http import ApiAuth, create_app, json_response
from ibpool_runtime.metrics import ServiceMetrics

TOKENS = {"operator": "op-secret", "client": "sched-secret", "readonly": "ro-secret"}


async def ready() -> dict[str, bool]:
    return {"bus": True}


def routes(a: web.Application) -> None:
    async def ok(_: web.Request) -> web.Response:
        return json_response({"ok": True})

    a.router.add_get("/v1/pool", ok)
    a.router.add_post("/v1/allocations", ok)
    a.router.add_put("/v1/quotas/team-a", ok)


def auth_from(tmp_path: Path, text: str, **fields: object) -> ApiAuth | None:
    f = tmp_path / "tokens"
    f.write_text(text)
    return ApiAuth.from_config(BaseConfig(api_tokens_file=str(f), **fields))  # type: ignore[arg-type]


async def serve(auth: ApiAuth | None) -> TestClient:
    c = TestClient(TestServer(create_app(ServiceMetrics("demo"), ready, add_routes=routes, auth=auth)))
    await c.start_server()
    return c


def bearer(role: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[role]}"}


@pytest.mark.parametrize("protect_reads", [False, True])
async def test_each_role_may_do_what_its_role_allows(tmp_path: Path, protect_reads: bool) -> None:
    digest = hashlib.sha256(TOKENS["readonly"].encode()).hexdigest()
    text = f"# role token\noperator {TOKENS['operator']}\nclient {TOKENS['client']}\nreadonly sha256:{digest}\n"
    c = await serve(auth_from(tmp_path, text, api_protect_reads=protect_reads))
    try:
        cases = [
            ("GET", "/v1/pool", None, 401 if protect_reads else 200),
            ("GET", "/v1/pool", "readonly", 200),
            ("GET", "/healthz", None, 200),
            ("GET", "/metrics", None, 200),
            ("POST", "/v1/allocations", None, 401),
            ("POST", "/v1/allocations", "readonly", 403),
            ("POST", "/v1/allocations", "client", 200),
            ("POST", "/v1/allocations", "operator", 200),
            ("PUT", "/v1/quotas/team-a", "client", 403),
            ("PUT", "/v1/quotas/team-a", "operator", 200),
        ]
        for method, path, role, want in cases:
            headers = bearer(role) if role else {}
            r = await c.request(method, path, headers=headers)
            assert r.status == want, (method, path, role, r.status)
            if want == 401:
                assert r.headers["WWW-Authenticate"].startswith("Bearer")
        r = await c.post("/v1/allocations", headers={"Authorization": "Bearer op-secre"})
        assert r.status == 401 and (await r.json())["error"] == "unauthorized"
        # RFC 7235: the scheme is case-insensitive; another scheme or no token is not a bearer token
        for header, want in (
            (f"bearer {TOKENS['operator']}", 200),
            (f"BEARER  {TOKENS['operator']}", 200),
            (f"Basic {TOKENS['operator']}", 401),
            ("Bearer", 401),
            (TOKENS["operator"], 401),
        ):
            r = await c.put("/v1/quotas/team-a", headers={"Authorization": header})
            assert r.status == want, (header, r.status)
    finally:
        await c.close()


async def test_no_tokens_file_means_an_open_api() -> None:
    assert ApiAuth.from_config(BaseConfig()) is None
    c = await serve(None)
    try:
        assert (await c.post("/v1/allocations")).status == 200
    finally:
        await c.close()


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("admin secret\n", r"tokens:1: expected '<operator\|client\|readonly> <token>', got 'admin'"),
        ("# nothing\n\n", "no tokens"),
        ("client\n", "tokens:1: expected"),
    ],
)
def test_a_bad_tokens_file_is_a_config_error_naming_the_line(tmp_path: Path, text: str, error: str) -> None:
    with pytest.raises(ConfigError, match=error):
        auth_from(tmp_path, text)


def test_a_missing_tokens_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"api_tokens_file.*cannot read"):
        ApiAuth.from_config(BaseConfig(api_tokens_file=str(tmp_path / "nope")))
