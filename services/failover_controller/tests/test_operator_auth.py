"""With API tokens, the operator's actions are operator-only; reading the verdicts is not."""

from __future__ import annotations

from pathlib import Path

from ibpool_failover_controller.config import FailoverControllerConfig
from ibpool_runtime.http import ApiAuth


def test_recover_and_drain_need_the_operator_role_and_reads_stay_open(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("operator op-token\nclient client-token\n")
    auth = ApiAuth.from_config(FailoverControllerConfig(api_tokens_file=str(tokens)))
    assert auth is not None
    for path in ("/health/nodes/n1/recover", "/health/nodes/n1/drain", "/health/nodes/n1/gpus/0/recover"):
        assert auth.allowed("POST", path) == ("operator",), path
    assert auth.allowed("GET", "/health/nodes/n1") == ()
    assert auth.role_of("Bearer client-token") == "client"
