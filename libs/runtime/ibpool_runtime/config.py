"""Service configuration: one msgspec Struct per service, read from env and an optional TOML file.

Precedence, lowest first: field defaults, the TOML file, the shared `IBPOOL_<FIELD>` env vars
(written by `ibpool dev up` for the bus and store URLs), `IBPOOL_<SERVICE>_<FIELD>`. An env var of
a list or table field holds JSON (`IBPOOL_SCHEDULER_QUEUES='["batch", "interactive"]'`). An invalid
value fails at start with a message naming the field, where it came from and what was wrong.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, TypeVar, get_origin

import msgspec


class ConfigError(Exception):
    """The configuration cannot be used; the message says which field and why."""


Positive = Annotated[float, msgspec.Meta(gt=0)]


class BaseConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Fields every service has. Services subclass this and add their own."""

    nats_url: str = "nats://127.0.0.1:4222"
    # A CA certificate (PEM) to verify the NATS servers with; set, the connection uses TLS.
    nats_tls_ca: str = ""
    postgres_dsn: str = "postgresql://postgres@127.0.0.1:5432/postgres"
    http_host: str = "127.0.0.1"
    http_port: int = 0
    instance: str = ""
    # JetStream stream replicas: 1 for the embedded server, 3 for a cluster.
    stream_replicas: int = 1
    # Bounded retries before a service gives up on NATS or Postgres and exits non-zero.
    connect_attempts: int = 10
    connect_backoff_s: float = 0.5
    consumer_batch: int = 64
    consumer_max_ack_pending: int = 1024
    consumer_ack_wait_s: float = 30.0
    consumer_max_deliver: int = 5
    shutdown_grace_s: float = 10.0
    outbox_window: int = 256
    # Handled event ids (the inbox) are kept one day longer than the streams keep messages (30 days,
    # streams.py): an event can come again only while its stream holds it. Older ones are deleted
    # every `inbox_prune_interval_s`.
    inbox_retention_s: Positive = 31 * 86_400.0
    inbox_prune_interval_s: Positive = 600.0
    log_level: str = "info"
    # HTTP API tokens: a file of '<operator|client|readonly> <token>' lines (or 'sha256:<hex>' digests).
    # Empty: the API is open (development). Reads need a token only with api_protect_reads.
    api_tokens_file: str = ""
    api_protect_reads: bool = False
    # Paths under which only operators may change state (quotas, fault injection).
    api_operator_paths: str = "/v1/quotas,/v1/sim"


C = TypeVar("C", bound=BaseConfig)

# Fields that `ibpool dev up` writes once for every service.
SHARED_FIELDS = ("nats_url", "nats_tls_ca", "postgres_dsn", "stream_replicas")


def env_name(service: str, field: str) -> str:
    return f"IBPOOL_{service.upper()}_{field.upper()}"


def load_config(
    config_type: type[C],
    service: str,
    env: Mapping[str, str] | None = None,
    toml_path: str | Path | None = None,
) -> C:
    """Build `config_type` from defaults, TOML and env; raise ConfigError naming the bad field."""
    env = os.environ if env is None else env
    raw: dict[str, Any] = {}
    origin: dict[str, str] = {}
    toml_path = toml_path or env.get(env_name(service, "config_file"))
    if toml_path:
        path = Path(toml_path)
        try:
            doc = tomllib.loads(path.read_bytes().decode())
        except FileNotFoundError:
            raise ConfigError(f"config file {path} does not exist") from None
        except OSError as e:
            raise ConfigError(f"config file {path} cannot be read: {e.strerror or e}") from None
        except UnicodeDecodeError as e:
            raise ConfigError(f"config file {path} is not UTF-8 (byte {e.start}): {e.reason}") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"config file {path} is not valid TOML: {e}") from None
        section = doc.get(service, doc)
        if not isinstance(section, dict):
            raise ConfigError(f"config file {path}: `{service}` must be a table ([{service}]), not a value")
        for k, v in section.items():
            raw[k] = v
            origin[k] = f"{path} [{service}] {k}"
    infos = msgspec.structs.fields(config_type)
    fields = {f.name for f in infos}
    structured = {f.name for f in infos if get_origin(f.type) in (list, dict, set, tuple)}
    for f in fields:
        for name in ((f"IBPOOL_{f.upper()}",) if f in SHARED_FIELDS else ()) + (env_name(service, f),):
            if name in env:
                raw[f] = _json_value(env[name], name) if f in structured else env[name]
                origin[f] = f"env {name}"
    prefix = f"IBPOOL_{service.upper()}_"
    unknown = [k for k in env if k.startswith(prefix) and k[len(prefix) :].lower() not in fields | {"config_file"}]
    if unknown:
        raise ConfigError(f"unknown setting(s) for {service}: {', '.join(sorted(unknown))}; known: {sorted(fields)}")
    try:
        return msgspec.convert(raw, config_type, strict=False)
    except msgspec.ValidationError as e:
        msg = str(e)
        field = _field_of(msg)
        where = origin.get(field, "") if field else ""
        where_text = f" (from {where})" if where else ""
        raise ConfigError(f"invalid {service} config: field `{field or '?'}`{where_text}: {msg}") from None


def _json_value(text: str, var: str) -> Any:
    """The JSON in env var `var` (a list or table field's value)."""
    try:
        return msgspec.json.decode(text)
    except msgspec.DecodeError as e:
        raise ConfigError(f"env {var} must hold JSON (a list or table field): {e}") from None


def _field_of(validation_message: str) -> str | None:
    marker = "at `$."
    if marker in validation_message:
        return validation_message.split(marker, 1)[1].split("`", 1)[0].split(".")[0].split("[")[0]
    if "Object contains unknown field `" in validation_message:
        return validation_message.split("unknown field `", 1)[1].split("`", 1)[0]
    if "missing required field `" in validation_message:
        return validation_message.split("required field `", 1)[1].split("`", 1)[0]
    return None
