"""Signatures: how an entry written on another machine can be trusted without re-verifying it.

An entry is signed with HMAC-SHA256 under a key the team shares (CUDA_AGENT_TRUST_KEY or the
`trust_key` option). The MAC covers every field except the signature itself and `last_used`
(which changes with use, not with content), including the cache key the entry was made for,
so a signed kernel cannot be moved to another shape, GPU or precision. A signature names the
key it was made with by a short id, so "signed with our key but does not match" (tampered or
damaged: refused) can be told apart from "signed with some other key" (just not trusted).
"""
from __future__ import annotations

import enum
import hashlib
import hmac
import os

from .entry import Entry
from .keys import canonical_json

TRUST_KEY_ENV = "CUDA_AGENT_TRUST_KEY"
SCHEME = "hmac-sha256"


class Signature(enum.Enum):
    VALID = "valid"  # made with our key over exactly this content: trusted
    UNSIGNED = "unsigned"
    FOREIGN = "foreign"  # made with another key, or we have no key to check it with
    INVALID = "invalid"  # claims our key but does not match the content: refused


def resolve_trust_key(trust_key: str | bytes | None) -> bytes | None:
    """The key given, else the environment's; None when neither is set."""
    if trust_key is None:
        trust_key = os.environ.get(TRUST_KEY_ENV)
    if isinstance(trust_key, str):
        trust_key = trust_key.encode()
    return trust_key or None


def key_id(trust_key: bytes) -> str:
    # Derived through HMAC, so the id says which key signed without saying anything about it.
    return hmac.new(trust_key, b"cuda-agent key id", hashlib.sha256).hexdigest()[:16]


def sign(entry: Entry, trust_key: bytes) -> str:
    return f"{SCHEME}:{key_id(trust_key)}:{_mac(entry, trust_key)}"


def check_signature(entry: Entry, trust_key: bytes | None) -> Signature:
    if not entry.signature:
        return Signature.UNSIGNED
    scheme, _, rest = entry.signature.partition(":")
    signer, _, mac = rest.partition(":")
    if trust_key is None or scheme != SCHEME or signer != key_id(trust_key):
        return Signature.FOREIGN
    if hmac.compare_digest(mac, _mac(entry, trust_key)):
        return Signature.VALID
    return Signature.INVALID


def _mac(entry: Entry, trust_key: bytes) -> str:
    content = entry.to_json()
    del content["signature"], content["last_used"]
    return hmac.new(trust_key, canonical_json(content).encode(), hashlib.sha256).hexdigest()
