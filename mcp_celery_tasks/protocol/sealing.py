"""Sealed ``requestState`` for MRTR rounds: authenticated encryption, key ids for rotation.

The state is opaque to clients and bound to the principal, the tool and a hash of its
arguments, with an expiry; anything that does not open, or opens bound to something else,
is refused with -32602. Keys come from ``MCP_TASKS_SECRET_KEYS`` (newest first); a server
without one generates a key per process (fine for one process; ``dev`` persists one).

Each state carries a random nonce and is usable once: the round that advances with it
(``rounds.spend``) retires it, and a replay is -32602, so a captured state cannot start the same
pre-task round's task twice. A retry that is refused (an invalid answer, another tool) does not
spend it. Spent nonces are kept twice: here, in the API process, as a cheap first line (a replay
to the same replica is refused before any query), and in Postgres (``mcp_spent_request_states``,
keyed by ``spent_digest``), so a replay sent to another replica within
``request_state_ttl_seconds`` is refused as well.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import heapq
import json
import os
import time
from collections.abc import Mapping
from typing import Final

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from mcp_celery_tasks.errors import InvalidParams
from mcp_celery_tasks.json_types import JSONObject

__all__ = ["Sealer", "arguments_hash", "generate_key", "spent_digest"]


ALREADY_USED: Final = "The requestState was already used; call the tool again"


def generate_key() -> str:
    return base64.urlsafe_b64encode(os.urandom(32)).decode().rstrip("=")


def _decode_key(text: str) -> bytes:
    key = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    if len(key) not in (16, 24, 32):
        raise ValueError("a secret key must be 16, 24 or 32 bytes of URL-safe base64")
    return key


def arguments_hash(arguments: Mapping[str, object]) -> str:
    canonical = json.dumps(arguments, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:32]


def spent_digest(payload: Mapping[str, object]) -> tuple[str, float] | None:
    """(the digest a spent state is recorded under, its expiry in epoch seconds), or None for a
    state sealed before states carried a nonce (a rolling upgrade: nothing to retire).

    The digest is of the sealed nonce, not of the state's text: base64 decoding ignores the
    spare bits of the last character, so several texts open to the same state, while the nonce
    sits inside the authenticated payload and only a key holder can choose it."""
    nonce, expires = payload.get("n"), payload.get("exp")
    if not isinstance(nonce, str) or not isinstance(expires, int | float):
        return None
    return hashlib.sha256(nonce.encode()).hexdigest()[:32], float(expires)


class Sealer:
    """Seals and opens request states with AES-GCM; the first key seals, all keys open."""

    def __init__(self, keys: list[str]) -> None:
        material = [_decode_key(k) for k in keys] or [os.urandom(32)]
        self._keys = {hashlib.sha256(k).hexdigest()[:8]: AESGCM(k) for k in material}
        self._current = next(iter(self._keys))
        self._spent: set[str] = set()
        self._expiring: list[tuple[float, str]] = []  # (exp, nonce): spent nonces, soonest first

    def seal(self, payload: Mapping[str, object], ttl_s: float) -> str:
        nonce_text = base64.urlsafe_b64encode(os.urandom(12)).decode()
        sealed_payload = {**payload, "n": nonce_text, "exp": int(time.time() + ttl_s)}
        body = json.dumps(sealed_payload, separators=(",", ":")).encode()
        nonce = os.urandom(12)
        sealed = self._keys[self._current].encrypt(nonce, body, self._current.encode())
        return f"{self._current}.{base64.urlsafe_b64encode(nonce + sealed).decode().rstrip('=')}"

    def open(self, state: str, **bound: object) -> JSONObject:
        """The payload, if the state opens, has not expired and matches every ``bound`` field."""
        key_id, _, blob = state.partition(".")
        aead = self._keys.get(key_id)
        if aead is None or not blob:
            raise InvalidParams("Invalid requestState")
        try:
            raw = base64.urlsafe_b64decode(blob + "=" * (-len(blob) % 4))
            payload: JSONObject = json.loads(aead.decrypt(raw[:12], raw[12:], key_id.encode()))
        except (InvalidTag, ValueError, binascii.Error):
            raise InvalidParams("Invalid requestState") from None
        expires = payload.get("exp", 0)  # sealed by us: always a number
        if not isinstance(expires, int | float) or expires < time.time():
            raise InvalidParams("The requestState has expired; call the tool again")
        for name, value in bound.items():
            if payload.get(name) != value:
                raise InvalidParams("The requestState belongs to another request")
        if payload.get("n") in self._spent:
            raise InvalidParams(ALREADY_USED)
        return payload

    def spend(self, payload: JSONObject) -> None:
        """Retire an opened state in this process; -32602 if it already was (two replays
        racing here: no await between the check and the record, so one of them wins)."""
        spent = spent_digest(payload)
        if spent is None:
            return
        nonce = str(payload["n"])
        now = time.time()
        while self._expiring and self._expiring[0][0] < now:
            self._spent.discard(heapq.heappop(self._expiring)[1])  # expired: open refuses it anyway
        if nonce in self._spent:
            raise InvalidParams(ALREADY_USED)
        self._spent.add(nonce)
        heapq.heappush(self._expiring, (spent[1], nonce))

    def unspend(self, payload: JSONObject) -> None:
        """Forget a local ``spend`` whose shared record could not be written (the database did
        not answer): the client's retry of the same state must not be refused for it."""
        self._spent.discard(str(payload.get("n")))  # its heap entry goes when it expires
