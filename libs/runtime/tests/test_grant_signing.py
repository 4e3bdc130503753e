"""Grant signatures (nkeys ed25519): signed by the allocator's seed, checked against trusted public keys."""

from __future__ import annotations

import datetime as dt

import pytest

from ibpool_proto.pool import AllocationGranted, Enforcement, GpuAssignment, ReleaseAllocation
from ibpool_runtime.bus import outgoing
from ibpool_runtime.grant_signing import (
    SIGNATURE_HEADER,
    SIGNER_HEADER,
    GrantSigner,
    GrantVerifier,
    SigningKeyError,
    load_seed,
    new_seed,
    public_key_of,
)

T0 = dt.datetime(2026, 12, 4, tzinfo=dt.UTC)


def grant() -> AllocationGranted:
    return AllocationGranted(
        source="pool",
        key="n1",
        allocation_id="a1",
        job_id="j",
        node_id="n1",
        kind="whole",
        assignments=[GpuAssignment(node_id="n1", gpu_index=0)],
        enforcement=Enforcement(),
        lease_expires_at=T0,
        ledger_version=1,
    )


def test_a_signed_grant_verifies_and_any_change_or_other_key_does_not() -> None:
    seed = new_seed()
    assert seed.startswith("SU") and public_key_of(seed).startswith("U")
    signer = GrantSigner(seed)
    m = grant()
    out = signer.sign(m, outgoing(m))
    assert out.headers[SIGNER_HEADER] == signer.public_key and out.body == outgoing(m).body
    verifier = GrantVerifier([public_key_of(new_seed()), signer.public_key])  # a rotation: two keys trusted
    assert verifier.check(out.body, out.headers) is None
    assert verifier.check(out.body.replace(b'"n1"', b'"n2"'), out.headers) == (
        f"the signature of {signer.public_key[:12]}... does not match the message"
    )
    assert verifier.check(out.body, {}) == "not signed by the pool allocator"
    stranger = GrantSigner(new_seed())
    forged = stranger.sign(m, outgoing(m))
    assert "a key this agent does not trust" in (verifier.check(forged.body, forged.headers) or "")
    garbled = {**out.headers, SIGNATURE_HEADER: "!!!"}
    assert "does not match" in (verifier.check(out.body, garbled) or "")


def test_only_what_an_agent_acts_on_is_signed() -> None:
    signer = GrantSigner(new_seed())
    release = ReleaseAllocation(source="s", key="a1", allocation_id="a1")
    assert SIGNER_HEADER not in signer.sign(release, outgoing(release)).headers


def test_bad_keys_and_seed_files_are_clear_errors(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SigningKeyError, match="not an nkeys seed"):
        public_key_of("SUnotaseed")
    with pytest.raises(SigningKeyError, match="checksum"):
        key = public_key_of(new_seed())
        GrantVerifier([key[:-2] + ("AA" if key[-2:] != "AA" else "BB")])
    with pytest.raises(SigningKeyError, match="no public key"):
        GrantVerifier([])
    path = tmp_path / "seed"
    path.write_text(new_seed() + "\n")
    assert load_seed(str(path)).startswith("SU")
    with pytest.raises(SigningKeyError, match="no seed to read"):
        load_seed(str(tmp_path / "missing"))
