"""Request -> principal: static tokens and JWT access tokens; anything else is a 401."""

from __future__ import annotations

import time
from typing import Any

import jwt
import pytest

from mcp_celery_tasks.api.auth import ANONYMOUS, Authenticator, Unauthorized
from mcp_celery_tasks.settings import Settings

SECRET = "s" * 32
ISSUER = "https://issuer.example"


def token(**claims: Any) -> str:
    payload = {"iss": ISSUER, "sub": "user-1", "aud": "mcp", "exp": int(time.time()) + 60, **claims}
    return "Bearer " + jwt.encode(payload, SECRET, algorithm="HS256")


@pytest.fixture
def authenticator() -> Authenticator:
    return Authenticator(
        Settings(
            auth_tokens={"alice": "alice-token", "bob": "bob-token"},
            jwt_issuer=ISSUER,
            jwt_audience="mcp",
            jwt_public_key=SECRET,
            jwt_algorithms=["HS256"],
        )
    )


def test_auth_off_everyone_is_anonymous() -> None:
    assert Authenticator(Settings()).principal(None) == ANONYMOUS
    assert Authenticator(Settings()).principal("Bearer anything") == ANONYMOUS


def test_a_static_token_names_its_principal(authenticator: Authenticator) -> None:
    assert authenticator.principal("Bearer alice-token") == "token:alice"
    assert authenticator.principal("bearer  bob-token ") == "token:bob"


def test_a_valid_jwt_is_issuer_and_subject(authenticator: Authenticator) -> None:
    assert authenticator.principal(token()) == f"jwt:{ISSUER}#user-1"


@pytest.mark.parametrize(
    "header",
    [
        None,
        "",
        "Basic alice-token",
        "Bearer",
        "Bearer wrong-token",
        "Bearer alice-token-but-longer",
    ],
)
def test_missing_or_wrong_credentials_are_refused(authenticator: Authenticator, header: str | None) -> None:
    with pytest.raises(Unauthorized):
        authenticator.principal(header)


@pytest.mark.parametrize(
    "claims", [{"iss": "https://evil.example"}, {"aud": "other"}, {"exp": int(time.time()) - 120}]
)
def test_a_jwt_with_wrong_claims_is_refused(authenticator: Authenticator, claims: dict[str, Any]) -> None:
    with pytest.raises(Unauthorized):
        authenticator.principal(token(**claims))


def test_a_jwt_without_a_subject_is_refused(authenticator: Authenticator) -> None:
    payload = {"iss": ISSUER, "aud": "mcp", "exp": int(time.time()) + 60}
    with pytest.raises(Unauthorized):
        authenticator.principal("Bearer " + jwt.encode(payload, SECRET, algorithm="HS256"))


def test_a_jwt_signed_with_another_key_or_algorithm_is_refused(authenticator: Authenticator) -> None:
    forged = jwt.encode(
        {"iss": ISSUER, "sub": "u", "aud": "mcp", "exp": int(time.time()) + 60}, "x" * 32, "HS256"
    )
    with pytest.raises(Unauthorized):
        authenticator.principal("Bearer " + forged)
    unsigned = jwt.encode({"iss": ISSUER, "sub": "u", "aud": "mcp", "exp": int(time.time()) + 60}, "", "none")
    with pytest.raises(Unauthorized):
        authenticator.principal("Bearer " + unsigned)


def test_the_challenge_points_at_the_resource_metadata(authenticator: Authenticator) -> None:
    challenge = authenticator.challenge("http://127.0.0.1:8000/", 'bad "token"')
    assert 'resource_metadata="http://127.0.0.1:8000/.well-known/oauth-protected-resource"' in challenge
    assert '"token"' not in challenge  # quotes in the reason cannot break the header
