"""The stack `ibpool run` and `ibpool dev up` start by default is locked: a real nats-server with a
user per service and a real PostgreSQL with a password, their credentials generated into the state
dir; without credentials both refuse, with a service's own user the service works within its
permissions, and the admin makes the streams."""

from __future__ import annotations

import stat
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import msgspec
import nats
import nats.errors
import pytest

from ibpool_cli.streams import ensure_streams
from ibpool_proto.pool import AllocationGranted
from ibpool_runtime import devstack
from ibpool_runtime.bus import Bus, StreamSetupError
from ibpool_runtime.config import BaseConfig
from ibpool_runtime.http import ApiAuth


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[devstack.StackInfo]:
    state = tmp_path_factory.mktemp("secured")
    info = devstack.up(state, secure=True)
    try:
        yield info
    finally:
        devstack.down(state)


async def test_without_credentials_nats_and_postgres_refuse(secured: devstack.StackInfo) -> None:
    with pytest.raises(Exception) as e:  # nats.py: the server's "Authorization Violation"
        await nats.connect(secured.nats_url, allow_reconnect=False, connect_timeout=2, max_reconnect_attempts=0)
    assert "uthoriz" in str(e.value) or isinstance(e.value, nats.errors.NoServersError), e.value
    password = (Path(secured.secrets_dir) / "postgres.password").read_text().strip()
    assert f":{password}@" in secured.postgres_dsn
    with pytest.raises(asyncpg.InvalidPasswordError):
        await asyncpg.connect(secured.postgres_dsn.replace(f":{password}@", "@"), timeout=5)
    with pytest.raises(asyncpg.InvalidPasswordError):
        await asyncpg.connect(secured.postgres_dsn.replace(f":{password}@", ":wrong@"), timeout=5)
    conn = await asyncpg.connect(secured.postgres_dsn, timeout=5)
    assert await conn.fetchval("SELECT 1") == 1
    await conn.close()


async def test_the_admin_makes_the_streams_and_a_service_user_stays_within_its_permissions(
    secured: devstack.StackInfo,
) -> None:
    agent = await Bus.connect(devstack.nats_url_as(secured, "node_agent"), name="t-agent", attempts=2)
    try:
        with pytest.raises(StreamSetupError):  # before the admin made them, a service may not
            await agent.ensure_streams()
        await ensure_streams(devstack.nats_url_as(secured, "admin"))
        await agent.ensure_streams()  # in place now: the agent goes on
        with pytest.raises(nats.errors.TimeoutError):  # the agent's user may not publish a grant: no ack
            await agent.js.publish(AllocationGranted.subject("n1"), b"{}", timeout=1.0)
    finally:
        await agent.close()


def test_the_secrets_are_private_and_the_env_file_gives_each_service_its_own_user(
    secured: devstack.StackInfo,
) -> None:
    folder = Path(secured.secrets_dir)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in folder.iterdir())
    env = (Path(secured.state_dir) / devstack.ENV_FILE).read_text()
    assert stat.S_IMODE((Path(secured.state_dir) / devstack.ENV_FILE).stat().st_mode) == 0o600
    for service in devstack.SERVICE_USERS:
        assert f"IBPOOL_{service.upper()}_NATS_URL={devstack.nats_url_as(secured, service)}" in env
    auth = ApiAuth.from_config(BaseConfig(api_tokens_file=devstack.api_tokens_file(secured)))
    assert auth is not None
    token = devstack.api_token(secured)
    assert auth.role_of(f"Bearer {token}") == "operator"
    assert auth.role_of(f"Bearer {devstack.api_token(secured, 'client')}") == "client"
    opened = msgspec.structs.replace(secured, secrets_dir="")  # an open stack hands out nothing
    assert devstack.api_token(opened) is None and devstack.nats_url_as(opened, "admin") == secured.nats_url
