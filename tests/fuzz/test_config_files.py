"""Configuration: `ibpool_runtime.config.load_config` on arbitrary TOML files (bytes, and tables of
the service's own settings with values of any type) and arbitrary env values, and the API tokens
file of `ApiAuth.from_config`, raise only `ConfigError` naming the field or file."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ibpool_autoscaler.config import AutoscalerConfig
from ibpool_fabric_monitor.config import FabricMonitorConfig
from ibpool_failover_controller.config import FailoverControllerConfig
from ibpool_node_agent.config import NodeAgentConfig
from ibpool_pool_allocator.config import PoolAllocatorConfig
from ibpool_runtime.config import BaseConfig, ConfigError, env_name, load_config
from ibpool_runtime.http import ApiAuth
from ibpool_scheduler.config import SchedulerConfig
from tests.fuzz.budget import FUZZ, TRICKY_TOKENS, mutated

CONFIGS: dict[str, type[BaseConfig]] = {
    "scheduler": SchedulerConfig,
    "pool_allocator": PoolAllocatorConfig,
    "autoscaler": AutoscalerConfig,
    "fabric_monitor": FabricMonitorConfig,
    "failover_controller": FailoverControllerConfig,
    "node_agent": NodeAgentConfig,
}

toml_scalars = (
    st.integers(-(2**70), 2**70).map(str)
    | st.floats(allow_nan=False).map(lambda f: repr(f) if f == f and abs(f) != float("inf") else "inf")
    | st.booleans().map(lambda b: "true" if b else "false")
    | st.text(max_size=12).map(json.dumps)
    | st.sampled_from(["1979-05-27T07:32:00Z", "07:32:00", "nan", "-inf", "''", "0x10", "1_000"])
)
toml_values = st.recursive(
    toml_scalars,
    lambda inner: (
        st.lists(inner, max_size=3).map(lambda v: "[" + ", ".join(v) + "]")
        | st.dictionaries(st.from_regex(r"[a-z_]{1,8}", fullmatch=True), inner, max_size=3).map(
            lambda d: "{" + ", ".join(f"{k} = {v}" for k, v in d.items()) + "}"
        )
    ),
    max_leaves=6,
)


FILES = Path(tempfile.mkdtemp(prefix="ibpool-fuzz-config-"))


def loads_or_rejects(service: str, toml: bytes | None, env: dict[str, str]) -> None:
    path = FILES / "service.toml"
    if toml is not None:
        path.write_bytes(toml)
    try:
        cfg = load_config(CONFIGS[service], service, env=env, toml_path=path if toml is not None else None)
    except ConfigError as e:
        assert str(e)
        return
    assert isinstance(cfg, CONFIGS[service])


def fields_of(service: str) -> list[str]:
    return [f.name for f in msgspec.structs.fields(CONFIGS[service])]


@pytest.mark.parametrize("service", sorted(CONFIGS))
@FUZZ
@given(data=st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
def test_arbitrary_toml_files(service: str, data: bytes) -> None:
    loads_or_rejects(service, data, {})


@pytest.mark.parametrize("service", sorted(CONFIGS))
@FUZZ
@given(data=st.data())
def test_toml_tables_of_the_service_settings(service: str, data: st.DataObject) -> None:
    names = st.sampled_from([*fields_of(service), "unknown_setting"])
    pairs = data.draw(st.dictionaries(names, toml_values, max_size=4))
    body = "\n".join(f"{k} = {v}" for k, v in pairs.items())
    header = data.draw(st.sampled_from([f"[{service}]\n", "", f"{service} = 3\n", f"[{service}.x]\n", "[other]\n"]))
    toml = (header + body + "\n").encode()
    loads_or_rejects(service, toml, {})
    loads_or_rejects(service, data.draw(mutated(toml)), {})


@pytest.mark.parametrize("service", sorted(CONFIGS))
@FUZZ
@given(data=st.data())
def test_environment_values(service: str, data: st.DataObject) -> None:
    names = st.sampled_from([*fields_of(service), "unknown_setting"])
    values = st.text(max_size=12) | st.sampled_from([*TRICKY_TOKENS, "true", "1e999", "[1,2]", "{}"])
    env: dict[str, Any] = {
        env_name(service, k): v for k, v in data.draw(st.dictionaries(names, values, max_size=4)).items()
    }
    loads_or_rejects(service, None, env)


token_lines = st.lists(st.sampled_from(["operator ", "client ", "readonly ", "x", "sha256:", "\n", "#", "\xff"]))


@FUZZ
@given(st.binary(max_size=200) | token_lines.map(lambda p: "".join(p).encode("utf-8", "surrogateescape")))
def test_api_tokens_files(data: bytes) -> None:
    path = FILES / "tokens"
    path.write_bytes(data)
    try:
        auth = ApiAuth.from_config(BaseConfig(api_tokens_file=str(path)))
    except ConfigError as e:
        assert str(path) in str(e)
        return
    assert auth is not None and auth.roles
