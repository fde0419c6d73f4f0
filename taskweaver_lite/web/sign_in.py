"""The page's sign-ins: the server's key that signs their cookies, and the cookie's value.

A sign-in is a row in the store (`sign_ins`: whose, from which token, until when, ended or not); the
cookie holds `<sign-in id>.<until>.<HMAC-SHA256>` signed with this key. The key is not in the store:
reading the store (a backup, a leaked dump, a cell that reached it) gives no way to make a cookie,
and a cookie whose row is ended (a sign-out on any replica), run out, or of a user since removed or
given a new token is refused. `until` is never past `serve.sign_in_hours` from when it was made,
however the value was made: a longer one is refused.

The key lives in a file: `serve.sign_in_key_file`, else `sign-in.key` in the state folder, made
(owner-only, 32 random bytes) at the first start. Replicas of one service must read the same file
(a secret mounted into each); a replica started with another key than the last one on its store
says so in one line at start, since sign-ins made on one would be refused by the other.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from taskweaver_lite.errors import ConfigError
from taskweaver_lite.store.interface import SignIn, Store

MIN_KEY_BYTES = 32
COOKIE_VALUE = re.compile(r"^([0-9a-f]{32})\.([0-9]{1,12})\.([0-9a-f]{64})$")
_CHECK = b"taskweaver-lite sign-in key check"


@dataclass(frozen=True)
class SignInKey:
    """The key that signs sign-in cookies, and the file it came from (for messages)."""

    key: bytes
    path: Path

    @classmethod
    def load(cls, path: Path, *, explicit: bool) -> SignInKey:
        """The key in `path`; made there first (owner-only) when it is the default place and has none. ConfigError naming serve.sign_in_key_file otherwise."""
        if not path.exists() and not explicit:
            _make(path)
        try:
            data = path.read_bytes().strip()
        except OSError as exc:
            raise ConfigError(
                f"serve.sign_in_key_file: {path} cannot be read ({exc.strerror or exc}); make one with `openssl rand -hex 32 > {path}` "
                "and give every replica the same file"
            ) from None
        if len(data) < MIN_KEY_BYTES:
            raise ConfigError(
                f"serve.sign_in_key_file: {path} holds {len(data)} bytes, fewer than {MIN_KEY_BYTES}; make one with `openssl rand -hex 32 > {path}`"
            )
        return cls(hashlib.sha256(b"taskweaver-lite sign-in " + data).digest(), path)

    def check(self) -> str:
        """A digest that tells two keys apart without revealing either (kept in the store, so replicas see a mismatch)."""
        return hmac.new(self.key, _CHECK, hashlib.sha256).hexdigest()[:32]

    def cookie(self, sign_in_id: str, *, until: float) -> str:
        """The cookie's value for the sign-in `sign_in_id` that holds until `until` (epoch seconds)."""
        message = f"{sign_in_id}.{int(until)}"
        return f"{message}.{self._mac(message)}"

    def opened(self, value: str, *, now: float, longest: float) -> str | None:
        """The sign-in id a cookie names, when this key signed it and it runs out after `now` and within `longest` seconds of it; None otherwise."""
        match = COOKIE_VALUE.match(value)
        if match is None:
            return None
        message = f"{match.group(1)}.{match.group(2)}"
        if not hmac.compare_digest(self._mac(message), match.group(3)):
            return None
        until = int(match.group(2))
        if until <= now or until > now + longest + 1:
            return None
        return match.group(1)

    def seal(self, text: str) -> str:
        """`text` (no '.' in it) with this key's signature: a value a browser may carry and cannot change."""
        return f"{text}.{self._mac('sealed ' + text)}"

    def unsealed(self, value: str) -> str | None:
        """The text `seal` signed, when this key signed it; None otherwise."""
        text, _, mac = value.rpartition(".")
        return text if text and hmac.compare_digest(self._mac("sealed " + text), mac) else None

    def _mac(self, message: str) -> str:
        return hmac.new(self.key, message.encode(), hashlib.sha256).hexdigest()


def new_sign_in_id() -> str:
    """A new sign-in's id: random, never guessed."""
    return secrets.token_hex(16)


def _make(path: Path) -> None:
    """A new random key in `path`, owner-only, whole before anyone can read it, made once even when two servers start at the same moment."""
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, stat.S_IRUSR | stat.S_IWUSR)
        with os.fdopen(descriptor, "w") as file:
            file.write(secrets.token_hex(32) + "\n")
        os.link(temporary, path)  # fails when another server made it first: theirs is read
    except FileExistsError:
        pass
    except OSError as exc:
        raise ConfigError(
            f"the sign-in key cannot be made at {path} ({exc.strerror or exc}): set serve.sign_in_key_file to a file holding 32 random bytes or more "
            "(`openssl rand -hex 32`)"
        ) from None
    finally:
        temporary.unlink(missing_ok=True)


@dataclass(frozen=True)
class SignIns:
    """The page's sign-ins on one store: made, found by their cookie, and ended (a sign-out), with the key and `serve.sign_in_hours`."""

    store: Store
    key: SignInKey
    hours: float

    def make(self, *, user_id: str | None, token_id: str, via: str = "token") -> str:
        """A new sign-in in the store; returns its cookie's value, good for `hours`."""
        sign_in_id = new_sign_in_id()
        until = time.time() + self.hours * 3600.0
        self.store.add_sign_in(sign_in_id, user_id=user_id, token_id=token_id, until=until, via=via)
        return self.key.cookie(sign_in_id, until=until)

    def found(self, value: str) -> SignIn | None:
        """The sign-in a cookie names, while it holds (signed by this key, not run out, not ended, its user's token unchanged); None otherwise."""
        now = time.time()
        sign_in_id = self.key.opened(value, now=now, longest=self.hours * 3600.0) if value else None
        if sign_in_id is None:
            return None
        sign_in = self.store.sign_in(sign_in_id)
        return sign_in if sign_in is not None and sign_in.holds(now) else None

    def end(self, value: str) -> SignIn | None:
        """End the sign-in a cookie names (its cookie is refused from now on, on every server of the store); the one ended, if it held."""
        sign_in = self.found(value)
        if sign_in is not None:
            self.store.end_sign_in(sign_in.id)
        return sign_in
