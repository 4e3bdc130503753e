from pathlib import Path

import pytest

from ibpool_runtime.config import BaseConfig, ConfigError, load_config


class DemoConfig(BaseConfig, frozen=True, kw_only=True):
    nodes: int = 1
    interval_s: float = 1.0
    queues: list[str] = []
    labels: dict[str, str] = {}


def test_defaults_then_toml_then_shared_env_then_service_env(tmp_path: Path) -> None:
    toml = tmp_path / "c.toml"
    toml.write_text('[demo]\nnodes = 4\ninterval_s = 2.5\nnats_url = "nats://from-file:4222"\n')
    env = {"IBPOOL_NATS_URL": "nats://shared:4222", "IBPOOL_DEMO_NODES": "8"}
    cfg = load_config(DemoConfig, "demo", env=env, toml_path=toml)
    assert (cfg.nodes, cfg.interval_s, cfg.nats_url) == (8, 2.5, "nats://shared:4222")


def test_bad_env_value_names_field_and_variable() -> None:
    with pytest.raises(ConfigError) as e:
        load_config(DemoConfig, "demo", env={"IBPOOL_DEMO_NODES": "many"})
    assert "`nodes`" in str(e.value) and "IBPOOL_DEMO_NODES" in str(e.value) and "int" in str(e.value)


def test_bad_toml_value_names_the_file(tmp_path: Path) -> None:
    toml = tmp_path / "c.toml"
    toml.write_text('[demo]\ninterval_s = "soon"\n')
    with pytest.raises(ConfigError) as e:
        load_config(DemoConfig, "demo", env={}, toml_path=toml)
    assert "interval_s" in str(e.value) and str(toml) in str(e.value)


def test_unknown_setting_is_an_error_not_ignored() -> None:
    with pytest.raises(ConfigError) as e:
        load_config(DemoConfig, "demo", env={"IBPOOL_DEMO_NODSE": "3"})
    assert "IBPOOL_DEMO_NODSE" in str(e.value)


def test_unknown_key_in_toml_is_an_error(tmp_path: Path) -> None:
    toml = tmp_path / "c.toml"
    toml.write_text("[demo]\nnodez = 3\n")
    with pytest.raises(ConfigError) as e:
        load_config(DemoConfig, "demo", env={}, toml_path=toml)
    assert "nodez" in str(e.value)


def test_broken_toml_and_missing_file_are_clear(tmp_path: Path) -> None:
    broken = tmp_path / "b.toml"
    broken.write_text("[demo\nnodes = ")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(DemoConfig, "demo", env={}, toml_path=broken)
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(DemoConfig, "demo", env={}, toml_path=tmp_path / "missing.toml")


def test_list_and_table_fields_take_json_from_env() -> None:
    env = {"IBPOOL_DEMO_QUEUES": '["batch", "interactive"]', "IBPOOL_DEMO_LABELS": '{"site": "a"}'}
    cfg = load_config(DemoConfig, "demo", env=env)
    assert cfg.queues == ["batch", "interactive"] and cfg.labels == {"site": "a"}
    with pytest.raises(ConfigError) as e:
        load_config(DemoConfig, "demo", env={"IBPOOL_DEMO_QUEUES": "batch,interactive"})
    assert "IBPOOL_DEMO_QUEUES" in str(e.value) and "JSON" in str(e.value)
    with pytest.raises(ConfigError) as e:
        load_config(DemoConfig, "demo", env={"IBPOOL_DEMO_QUEUES": '{"not": "a list"}'})
    assert "`queues`" in str(e.value) and "IBPOOL_DEMO_QUEUES" in str(e.value)
