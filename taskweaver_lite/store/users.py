"""Users' tokens: made once, shown once, kept only as a salted scrypt hash.

A token reads `twl_<id>_<secret>`: the id (public, indexed) finds the user's row in one lookup,
and the secret is checked against its scrypt hash (hashlib's, memory-hard) in constant time.
Verifying costs ~20 ms of CPU, so a server keeps the tokens it has verified (as their SHA-256, never
the token) with the hash they matched: a later request pays one indexed row read, and a removed
user or a new token fails at once because the row is gone or its hash differs.

A user is known by an id of their own (random, never reused), not by their name: sessions and tips
belong to that id, so a name removed and added again is someone new.

A refused token costs one scrypt whatever was wrong with it (an unknown id, a malformed token, a
wrong secret), so the time a refusal takes tells nothing of which token ids exist. A sign-in on the
page is not the token: it is a row of its own, its cookie signed with the server's key (web/sign_in.py).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import threading
from dataclasses import dataclass

PREFIX = "twl_"
_TOKEN = re.compile(r"^twl_([0-9a-f]{16})_([A-Za-z0-9_-]{43})$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$")
# scrypt's cost: 16 MiB of memory and ~20 ms per check (RFC 7914's interactive-login figures).
SCRYPT_N, SCRYPT_R, SCRYPT_P = 1 << 14, 8, 1
_DECOY_SALT = "00" * 16
_DECOY_DIGEST = "00" * 32


@dataclass(frozen=True)
class NewToken:
    """A token as made: the whole token (shown once) and what the store keeps of it."""

    token: str
    token_id: str
    salt: str  # hex
    digest: str  # hex scrypt of the secret


def make_token() -> NewToken:
    """A fresh random token and its stored form."""
    token_id = secrets.token_hex(8)
    secret = secrets.token_urlsafe(32)
    salt = secrets.token_hex(16)
    return NewToken(token=f"{PREFIX}{token_id}_{secret}", token_id=token_id, salt=salt, digest=_kdf(secret, salt))


def make_user_id() -> str:
    """A new user's id: random, so a name used again never gets the old one's."""
    return secrets.token_hex(8)


def token_id(token: str) -> str | None:
    """The id part of a well-formed token; None for anything else (which no user has)."""
    match = _TOKEN.match(token)
    return match.group(1) if match else None


def check_name(name: str) -> str:
    """The name, when it is a usable user name; ValueError naming the rule otherwise."""
    if not _NAME.match(name):
        raise ValueError(f"'{name}' is not a usable user name: letters, digits, '.', '_', '@' and '-', at most 64, starting with a letter or digit")
    return name


class Verifier:
    """Checks a token's secret against a stored hash, remembering the pairs already verified in this process."""

    def __init__(self) -> None:
        self._verified: dict[str, str] = {}  # sha256(token) -> the digest it matched
        self._lock = threading.Lock()

    def refuse(self, token: str) -> None:
        """Spend on a token no user has what checking one would (a fixed salt and secret): a refusal takes as long whatever the reason."""
        match = _TOKEN.match(token)
        hmac.compare_digest(_kdf(match.group(2) if match else token[:64], _DECOY_SALT), _DECOY_DIGEST)

    def matches(self, token: str, *, salt: str, digest: str) -> bool:
        """Whether `token`'s secret hashes to `digest` with `salt`."""
        key = hashlib.sha256(token.encode()).hexdigest()
        with self._lock:
            if self._verified.get(key) == digest:
                return True
        match = _TOKEN.match(token)
        if match is None or not hmac.compare_digest(_kdf(match.group(2), salt), digest):
            return False
        with self._lock:
            if len(self._verified) > 10_000:
                self._verified.clear()
            self._verified[key] = digest
        return True


def _kdf(secret: str, salt: str) -> str:
    return hashlib.scrypt(secret.encode(), salt=bytes.fromhex(salt), n=SCRYPT_N, r=SCRYPT_R, p=SCRYPT_P, dklen=32).hex()
