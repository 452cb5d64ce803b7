"""Sealed MRTR ``requestState``: opaque, bound to principal/tool/arguments, expiring, rotatable."""

from __future__ import annotations

import base64

import pytest
from mcp_types import jsonrpc as codes

from mcp_celery_tasks.errors import InvalidParams
from mcp_celery_tasks.protocol.sealing import Sealer, arguments_hash, generate_key, spent_digest

BOUND = {"p": "token:alice", "t": "greet", "a": arguments_hash({"name": "x"})}


def test_a_sealed_state_opens_with_its_payload() -> None:
    sealer = Sealer([generate_key()])
    state = sealer.seal({"k": "task", "task": "T", **BOUND}, ttl_s=60)
    assert "task" not in state and "alice" not in state  # opaque to the client
    assert sealer.open(state, **BOUND)["task"] == "T"


@pytest.mark.parametrize("field", ["p", "t", "a"])
def test_a_state_bound_to_another_call_is_refused(field: str) -> None:
    sealer = Sealer([generate_key()])
    state = sealer.seal(dict(BOUND), ttl_s=60)
    with pytest.raises(InvalidParams) as refused:
        sealer.open(state, **{**BOUND, field: "other"})
    assert refused.value.code == codes.INVALID_PARAMS


def test_an_expired_state_is_refused() -> None:
    sealer = Sealer([generate_key()])
    state = sealer.seal(dict(BOUND), ttl_s=-1)
    with pytest.raises(InvalidParams, match="expired"):
        sealer.open(state, **BOUND)


@pytest.mark.parametrize("tamper", ["flip", "truncate", "other-key-id", "empty", "garbage"])
def test_a_tampered_state_is_refused(tamper: str) -> None:
    sealer = Sealer([generate_key()])
    state = sealer.seal(dict(BOUND), ttl_s=60)
    key_id, _, blob = state.partition(".")
    raw = bytearray(base64.urlsafe_b64decode(blob + "=" * (-len(blob) % 4)))
    if tamper == "flip":
        raw[-1] ^= 1
        state = f"{key_id}." + base64.urlsafe_b64encode(bytes(raw)).decode().rstrip("=")
    elif tamper == "truncate":
        state = state[:-6]
    elif tamper == "other-key-id":
        state = f"deadbeef.{blob}"
    elif tamper == "empty":
        state = f"{key_id}."
    else:
        state = "not a state at all"
    with pytest.raises(InvalidParams):
        Sealer([generate_key()]).open(state, **BOUND) if tamper == "other-key-id" else sealer.open(
            state, **BOUND
        )


def test_rotation_new_key_seals_old_keys_still_open() -> None:
    old, new = generate_key(), generate_key()
    before = Sealer([old]).seal(dict(BOUND), ttl_s=60)
    rotated = Sealer([new, old])
    assert rotated.open(before, **BOUND)["p"] == "token:alice"
    after = rotated.seal(dict(BOUND), ttl_s=60)
    with pytest.raises(InvalidParams):
        Sealer([old]).open(after, **BOUND)  # the old-only replica cannot open the new key's state


def test_without_keys_each_process_seals_for_itself() -> None:
    state = Sealer([]).seal(dict(BOUND), ttl_s=60)
    with pytest.raises(InvalidParams):
        Sealer([]).open(state, **BOUND)


def test_a_malformed_key_is_refused_at_start() -> None:
    with pytest.raises(ValueError, match="32 bytes"):
        Sealer([base64.urlsafe_b64encode(b"short").decode()])


def test_states_are_unique_per_seal() -> None:
    sealer = Sealer([generate_key()])
    assert sealer.seal(dict(BOUND), ttl_s=60) != sealer.seal(dict(BOUND), ttl_s=60)


def test_a_state_is_usable_once_after_its_round_advanced() -> None:
    sealer = Sealer([generate_key()])
    state = sealer.seal({"k": "pre", **BOUND}, ttl_s=60)
    opened = sealer.open(state, **BOUND)
    assert sealer.open(state, **BOUND) == opened  # opening alone spends nothing (a refused retry)
    sealer.spend(opened)
    with pytest.raises(InvalidParams, match="already used") as replayed:
        sealer.open(state, **BOUND)
    assert replayed.value.code == codes.INVALID_PARAMS
    with pytest.raises(InvalidParams, match="already used"):
        sealer.spend(opened)  # two replays that both opened before either advanced: one wins


def test_two_states_of_the_same_payload_are_spent_apart() -> None:
    sealer = Sealer([generate_key()])
    first, second = (sealer.seal({"k": "pre", **BOUND}, ttl_s=60) for _ in range(2))
    sealer.spend(sealer.open(first, **BOUND))
    assert sealer.open(second, **BOUND)["k"] == "pre"


def test_spent_nonces_are_forgotten_once_their_states_expire() -> None:
    sealer = Sealer([generate_key()])
    old = sealer.open(sealer.seal(dict(BOUND), ttl_s=60), **BOUND)
    sealer.spend({**old, "exp": 0})  # as if sealed long ago: expired by the next spend
    sealer.spend(sealer.open(sealer.seal(dict(BOUND), ttl_s=60), **BOUND))
    assert len(sealer._spent) == 1


def test_the_spent_digest_is_of_the_sealed_nonce_not_of_the_states_text() -> None:
    sealer = Sealer([generate_key()])
    # A state whose length leaves spare bits in its last base64 character (1 in 3 lengths do not).
    sealed = (sealer.seal({**BOUND, "x": "y" * i}, ttl_s=60) for i in range(3))
    state = next(s for s in sealed if len(s.partition(".")[2]) % 4)
    payload = sealer.open(state, **BOUND)
    key_id, _, blob = state.partition(".")
    # The last character's spare bits are ignored by base64: another text of the same state.
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    variants = [f"{key_id}.{blob[:-1]}{c}" for c in alphabet if c != blob[-1]]
    same = [v for v in variants if _opens(sealer, v)]
    assert same, "no other text of the state opened: the premise of this test is gone"
    digest = spent_digest(payload)
    assert digest is not None and digest[1] == payload["exp"]
    assert {spent_digest(sealer.open(v, **BOUND)) for v in same} == {digest}
    assert spent_digest(sealer.open(sealer.seal(dict(BOUND), ttl_s=60), **BOUND)) != digest


def _opens(sealer: Sealer, state: str) -> bool:
    try:
        sealer.open(state, **BOUND)
    except InvalidParams:
        return False
    return True


def test_a_state_sealed_without_a_nonce_has_nothing_to_retire() -> None:
    assert spent_digest({"p": "token:alice", "exp": 1}) is None


def test_a_spend_forgotten_after_a_failed_record_opens_again() -> None:
    sealer = Sealer([generate_key()])
    state = sealer.seal(dict(BOUND), ttl_s=60)
    payload = sealer.open(state, **BOUND)
    sealer.spend(payload)
    with pytest.raises(InvalidParams, match="already used"):
        sealer.open(state, **BOUND)
    sealer.unspend(payload)
    sealer.spend(sealer.open(state, **BOUND))
