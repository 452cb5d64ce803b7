"""Request -> principal: static tokens and JWT access tokens; anything else is a 401."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import jwt
import pytest

from mcp_celery_tasks.api import auth
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
            resource_url="https://mcp.example/mcp",
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


def test_the_challenge_points_at_the_configured_resources_metadata(authenticator: Authenticator) -> None:
    challenge = authenticator.challenge("http://evil.example:8000/", 'bad "token" \u043a\\')
    # RFC 9728 §3.1's path-inserted URL, from the configured resource, never the Host header.
    assert 'resource_metadata="https://mcp.example/.well-known/oauth-protected-resource/mcp"' in challenge
    assert challenge.endswith('error_description="bad token "')  # no quote, backslash or non-ASCII
    assert authenticator.metadata("http://evil.example/")["resource"] == "https://mcp.example/mcp"


def test_a_jwt_setup_without_a_configured_resource_or_with_a_short_hmac_secret_does_not_start() -> None:
    base: dict[str, Any] = {"jwt_issuer": ISSUER, "jwt_public_key": SECRET, "jwt_algorithms": ["HS256"]}
    with pytest.raises(ValueError, match="MCP_TASKS_RESOURCE_URL"):
        Authenticator(Settings(**base, jwt_audience="mcp"))
    Authenticator(Settings(**base, jwt_audience="https://mcp.example/mcp"))  # a URL audience is the resource
    with pytest.raises(ValueError, match="at least 32"):
        Authenticator(Settings(**{**base, "jwt_public_key": "s3cret"}, resource_url="https://m.example/mcp"))


@pytest.mark.parametrize(
    ("claims", "scopes"),
    [({}, set()), ({"scope": "mcp models:train"}, {"mcp", "models:train"}), ({"scp": ["mcp"]}, {"mcp"})],
)
def test_a_jwts_scopes_come_from_its_scope_or_scp_claim(
    authenticator: Authenticator, claims: dict[str, Any], scopes: set[str]
) -> None:
    assert authenticator.identity(token(**claims)).scopes == frozenset(scopes)
    assert authenticator.identity("Bearer alice-token").scopes is None  # static tokens: not scope-limited


def test_a_jwt_without_a_required_scope_is_refused_and_the_challenge_names_it() -> None:
    required = Authenticator(
        Settings(jwt_issuer=ISSUER, jwt_audience="mcp", jwt_public_key=SECRET, jwt_algorithms=["HS256"],
                 resource_url="https://mcp.example/mcp", jwt_required_scopes=["mcp"])
    )  # fmt: skip
    with pytest.raises(Unauthorized, match="lacks a scope"):
        required.identity(token(scope="other"))
    assert required.identity(token(scope="mcp other")).principal == f"jwt:{ISSUER}#user-1"
    assert 'scope="mcp"' in required.challenge("https://mcp.example/", "x")
    # Tools registered by other tests in this process add their scopes: only "mcp" is certain.
    assert "mcp" in required.metadata("https://mcp.example/")["scopes_supported"]


@contextlib.contextmanager
def _issuer(status: int, fetches: list[float]) -> Iterator[Authenticator]:
    """An Authenticator whose JWKS URL is a local issuer answering ``status`` (200: one HMAC
    key ``k1``), each fetch noted in ``fetches``."""

    class Jwks(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            fetches.append(time.monotonic())
            body = json.dumps(
                {"keys": [{"kty": "oct", "kid": "k1", "k": "c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0LTEyMw"}]}
            ).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            if status == 200:
                self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Jwks)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield Authenticator(
            Settings(jwt_issuer=ISSUER, jwt_audience="mcp", jwt_algorithms=["HS256"], resource_url="https://m.example/mcp",
                     jwt_jwks_url=f"http://127.0.0.1:{server.server_port}/jwks.json")
        )  # fmt: skip
    finally:
        server.shutdown()


def test_an_unknown_kid_fetches_the_jwks_at_most_once_per_cooldown() -> None:
    """A token whose ``kid`` the issuer's keys lack (any characters: it once reached the 401
    header and made it HTTP 500) is refused with fixed text, and random ``kid``s cannot make
    each request a JWKS fetch."""
    fetches: list[float] = []
    with _issuer(200, fetches) as checker:
        payload = {"iss": ISSUER, "sub": "u", "aud": "mcp", "exp": int(time.time()) + 60}
        for kid in ("\u043a\u043b\u044e\u0447", "x" * 5000, "k2", "k3"):
            forged = jwt.encode(payload, SECRET, algorithm="HS256", headers={"kid": kid})
            with pytest.raises(Unauthorized) as refused:
                checker.identity("Bearer " + forged)
            assert str(refused.value) == "the token is signed with an unknown key"
    assert len(fetches) == 1  # the first lookup; every unknown kid after it waits for the cooldown


def test_a_failed_jwks_fetch_is_not_retried_until_its_cooldown_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    """An issuer that is down costs one fetch per cooldown, not one per request (a flood of
    tokens must not become a flood of requests to the issuer), and is asked again after it."""
    monkeypatch.setattr(auth, "KEY_FAILURE_COOLDOWN_S", 0.5)
    fetches: list[float] = []
    with _issuer(503, fetches) as checker:
        forged = "Bearer " + jwt.encode({"sub": "u"}, SECRET, algorithm="HS256", headers={"kid": "k1"})
        for _ in range(20):
            with pytest.raises(Unauthorized, match="cannot be fetched now"):
                checker.identity(forged)
        assert len(fetches) == 1
        time.sleep(0.6)
        with pytest.raises(Unauthorized, match="cannot be fetched now"):
            checker.identity(forged)
        assert len(fetches) == 2
