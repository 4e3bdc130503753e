"""NATS over TLS with the certificates deploy/tls/make-certs.sh makes: trusted CA in, others out."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ibpool_proto.node import NodeDeregistered
from ibpool_runtime import devstack
from ibpool_runtime.bus import Bus, BusUnavailable

ROOT = Path(__file__).resolve().parents[2]


def make_certs(out: Path, *names: str) -> None:
    subprocess.run(["bash", str(ROOT / "deploy/tls/make-certs.sh"), str(out), *names], check=True, capture_output=True)


@pytest.fixture
async def tls_nats() -> AsyncIterator[tuple[str, Path]]:
    """A nats-server that requires TLS; yields its address and the folder with its CA."""
    state = Path(tempfile.mkdtemp(prefix="ibpool-test-tls-"))
    certs = state / "tls"
    make_certs(certs)
    tls = (
        f'tls {{\n  cert_file: "{certs / "server.pem"}"\n  key_file: "{certs / "server-key.pem"}"\n'
        f'  ca_file: "{certs / "ca.pem"}"\n}}\n'
    )
    proc, url, _ = devstack.start_nats(state, extra_config=tls)
    try:
        yield url.removeprefix("nats://"), certs
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        shutil.rmtree(state, ignore_errors=True)


async def test_a_client_trusting_the_ca_connects_and_publishes(tls_nats: tuple[str, Path]) -> None:
    address, certs = tls_nats
    bus = await Bus.connect(f"tls://{address}", name="t", attempts=2, tls_ca=str(certs / "ca.pem"))
    try:
        await bus.ensure_streams()
        ack = await bus.publish(NodeDeregistered(source="t", key="n1", node_id="n1", reason="test"))
        assert ack.stream == "IBPOOL_NODE"
    finally:
        await bus.close()


async def test_a_client_without_the_ca_or_with_another_is_refused(tls_nats: tuple[str, Path], tmp_path: Path) -> None:
    address, _ = tls_nats
    with pytest.raises(BusUnavailable):
        await Bus.connect(f"tls://{address}", name="t", attempts=1)
    make_certs(tmp_path / "other")
    with pytest.raises(BusUnavailable):
        await Bus.connect(f"tls://{address}", name="t", attempts=1, tls_ca=str(tmp_path / "other" / "ca.pem"))
    with pytest.raises(BusUnavailable, match=r"cannot use .* as the NATS CA"):
        await Bus.connect(f"tls://{address}", name="t", attempts=1, tls_ca=str(tmp_path / "missing.pem"))
