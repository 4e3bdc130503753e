"""Grants that prove where they come from: the pool allocator signs what a node agent acts on.

A node agent starts work on an `AllocationGranted` and stops it on `AllocationRevoked`,
`AllocationReleased` and `AllocationExpired`. Whoever can publish one of those on a node's subject
could run a command there or stop someone's work; the bus's permissions say who may publish, and
the signature says, end to end, that the allocator did. The allocator signs the exact bytes of each
such event with an ed25519 key only it holds (NATS's nkeys format: a seed `SU...`, a public key
`U...`), in two headers:

    ibpool-signer      the signer's public key
    ibpool-signature   base64url of the ed25519 signature over the message body

An agent configured with the allocator's public key(s) (`grant_signers`) refuses, before anything
else, an event of those types without a valid signature by one of them: it is dead-lettered with
the reason and counted, never acted on (`consumer.Refused`). Several keys may be trusted at once
(a key rotation: the new key added to the agents first, then given to the allocator).
"""

from __future__ import annotations

import base64
import binascii
import os
from collections.abc import Collection, Mapping
from pathlib import Path

import nacl.exceptions
import nacl.signing
import nkeys

from ibpool_proto.message import Message
from ibpool_proto.pool import AllocationExpired, AllocationGranted, AllocationReleased, AllocationRevoked

from .bus import OutgoingMessage

SIGNER_HEADER = "ibpool-signer"
SIGNATURE_HEADER = "ibpool-signature"
# What a node agent acts on: every one of them is signed.
SIGNED = (AllocationGranted, AllocationRevoked, AllocationReleased, AllocationExpired)


class SigningKeyError(ValueError):
    """A seed or public key that is not a valid nkey; the message says which and why."""


def new_seed() -> str:
    """A fresh signing seed (`SU...`, 58 characters): keep it secret, readable by the allocator only."""
    seed: bytes = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)
    return seed.decode()


def public_key_of(seed: str) -> str:
    """The public key (`U...`) of a seed; SigningKeyError when it is not an nkeys seed."""
    try:
        key: bytes = nkeys.from_seed(seed.strip().encode()).public_key
    except (nkeys.NkeysError, binascii.Error, ValueError) as e:
        raise SigningKeyError(f"not an nkeys seed: {e}") from None
    return key.decode()


def load_seed(path: str) -> str:
    """The seed in the file `path` (its first line); SigningKeyError naming the file when it is not one."""
    try:
        seed = Path(path).read_text().strip().splitlines()[0]
    except (OSError, IndexError) as e:
        raise SigningKeyError(f"{path}: no seed to read ({e})") from None
    public_key_of(seed)
    return seed


def _verify_key(public_key: str) -> nacl.signing.VerifyKey:
    """The ed25519 key of an nkeys public key: base32 of (prefix byte, 32 key bytes, CRC-16)."""
    text = public_key.strip()
    try:
        raw = base64.b32decode(text + "=" * (-len(text) % 8))
    except (binascii.Error, ValueError) as e:
        raise SigningKeyError(f"public key {text[:8]}...: not base32 ({e})") from None
    if len(raw) != 35 or not nkeys.valid_public_prefix_byte(raw[0]):
        raise SigningKeyError(f"public key {text[:8]}...: not an nkeys public key")
    if nkeys.crc16_checksum(raw[:33]) != raw[33:]:
        raise SigningKeyError(f"public key {text[:8]}...: checksum does not match")
    return nacl.signing.VerifyKey(raw[1:33])


class GrantSigner:
    """Signs the allocator's events that node agents act on (`SIGNED`); others pass unchanged."""

    def __init__(self, seed: str) -> None:
        self.public_key = public_key_of(seed)
        self._keys = nkeys.from_seed(seed.strip().encode())

    def sign(self, message: Message, out: OutgoingMessage) -> OutgoingMessage:
        if not isinstance(message, SIGNED):
            return out
        signature: bytes = self._keys.sign(out.body)
        headers = {
            **out.headers,
            SIGNER_HEADER: self.public_key,
            SIGNATURE_HEADER: base64.urlsafe_b64encode(signature).decode(),
        }
        return OutgoingMessage(out.subject, headers, out.body)


class GrantVerifier:
    """Checks the signature of an event a node agent acts on against the trusted public keys."""

    def __init__(self, public_keys: Collection[str]) -> None:
        if not public_keys:
            raise SigningKeyError("no public key to trust")
        self.keys = {k.strip(): _verify_key(k) for k in public_keys}

    def check(self, body: bytes, headers: Mapping[str, str]) -> str | None:
        """None when `body` carries a valid signature by a trusted key, else why not."""
        signer = headers.get(SIGNER_HEADER)
        signature = headers.get(SIGNATURE_HEADER)
        if signer is None or signature is None:
            return "not signed by the pool allocator"
        key = self.keys.get(signer)
        if key is None:
            return f"signed by {signer[:12]}..., a key this agent does not trust"
        try:
            key.verify(body, base64.urlsafe_b64decode(signature.encode()))
        except (nacl.exceptions.BadSignatureError, binascii.Error, ValueError):
            return f"the signature of {signer[:12]}... does not match the message"
        return None
