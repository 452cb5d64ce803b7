"""OAuth 2.1 resource-server mode: JWT access tokens, WWW-Authenticate, resource metadata."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from tests.support import Client, Proc, Stack, free_port, start_api

ISSUER = "https://issuer.example"
AUDIENCE = "https://mcp.example/mcp"
KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
OTHER_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)


def token(
    sub: str,
    *,
    key: Any = KEY,
    iss: str = ISSUER,
    aud: str = AUDIENCE,
    ttl: float = 300,
    kid: str = "k1",
    **extra: Any,
) -> str:
    now = int(time.time())
    claims = {"iss": iss, "aud": aud, "sub": sub, "iat": now, "exp": now + int(ttl), **extra}
    return jwt.encode(claims, key, algorithm="RS256", headers={"kid": kid})


class _Jwks(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(KEY.public_key()))
        body = json.dumps({"keys": [{**jwk, "kid": "k1", "use": "sig", "alg": "RS256"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def jwks_url() -> Iterator[str]:
    server = HTTPServer(("127.0.0.1", free_port()), _Jwks)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/jwks.json"
    server.shutdown()


@pytest.fixture(scope="module", params=["jwks", "pem"])
def jwt_api(request: pytest.FixtureRequest, stack: Stack, jwks_url: str) -> Iterator[str]:
    env = dict(stack.env)
    env.update({"MCP_TASKS_JWT_ISSUER": ISSUER, "MCP_TASKS_JWT_AUDIENCE": AUDIENCE})
    if request.param == "jwks":
        env["MCP_TASKS_JWT_JWKS_URL"] = jwks_url
    else:
        env["MCP_TASKS_JWT_PUBLIC_KEY"] = (
            KEY.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        ).decode()
    proc: Proc
    proc, url = start_api(f"jwt-api-{request.param}", env)
    yield url
    proc.stop()


def test_valid_jwt_is_accepted_and_owns_its_tasks_as_issuer_and_subject(jwt_api: str, stack: Stack) -> None:
    alice = Client(jwt_api, token=token("alice"))
    task_id = alice.start("noop")
    assert alice.wait_status(task_id)["status"] == "completed"
    assert stack.row(task_id)["owner"] == f"jwt:{ISSUER}#alice"
    bob = Client(jwt_api, token=token("bob"))
    foreign = bob.get(task_id)
    unknown = bob.get("no-such-task-id")
    assert foreign.error == unknown.error


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(lambda: token("alice", ttl=-120), id="expired"),
        pytest.param(lambda: token("alice", aud="https://other.example"), id="wrong-audience"),
        pytest.param(lambda: token("alice", iss="https://evil.example"), id="wrong-issuer"),
        pytest.param(lambda: token("alice", key=OTHER_KEY), id="bad-signature"),
        pytest.param(lambda: "not.a.jwt", id="garbage"),
        # A kid of any characters once reached the challenge header and made HTTP 500.
        pytest.param(lambda: token("alice", key=OTHER_KEY, kid='\u043a\u043b\u044e\u0447 "\\'), id="odd-kid"),
    ],
)
def test_bad_jwt_is_401_with_a_challenge_pointing_at_the_metadata(jwt_api: str, bad: Any) -> None:
    reply = Client(jwt_api, token=bad()).call_tool("noop")
    assert reply.status == 401
    challenge = reply.headers["www-authenticate"]
    assert challenge.startswith("Bearer ") and 'error="invalid_token"' in challenge
    assert "resource_metadata=" in challenge and "/.well-known/oauth-protected-resource" in challenge
    assert challenge.isascii() and "\u043a" not in reply.body["error"]["message"]


def test_missing_token_is_401(jwt_api: str) -> None:
    assert Client(jwt_api).call_tool("noop").status == 401


def test_protected_resource_metadata_names_the_issuer(jwt_api: str) -> None:
    base = jwt_api.removesuffix("/mcp")
    document = httpx.get(base + "/.well-known/oauth-protected-resource").json()
    assert document["authorization_servers"] == [ISSUER]
    assert document["resource"].endswith("/mcp")
    assert document["bearer_methods_supported"] == ["header"]


@pytest.fixture(scope="module")
def scoped_api(stack: Stack) -> Iterator[str]:
    """Every request needs the ``mcp`` scope; ``t_scoped`` also ``models:train``."""
    pem = KEY.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    env = dict(stack.env, MCP_TASKS_JWT_ISSUER=ISSUER, MCP_TASKS_JWT_AUDIENCE=AUDIENCE,
               MCP_TASKS_JWT_PUBLIC_KEY=pem.decode(), MCP_TASKS_JWT_REQUIRED_SCOPES='["mcp"]')  # fmt: skip
    proc: Proc
    proc, url = start_api("jwt-api-scoped", env)
    yield url
    proc.stop()


def test_a_token_without_the_required_scope_gets_a_401_naming_it(scoped_api: str) -> None:
    reply = Client(scoped_api, token=token("alice", scope="other")).call_tool("noop")
    assert reply.status == 401
    assert 'scope="mcp"' in reply.headers["www-authenticate"]


def test_a_tool_needing_more_scope_is_a_403_step_up_naming_only_that_scope(scoped_api: str) -> None:
    basic = Client(scoped_api, token=token("alice", scope="mcp"))
    assert basic.call_tool("greet", {"name": "scoped"}, extension=False).status == 200
    refused = basic.call_tool("t_scoped", {"text": "x"}, extension=False)
    assert refused.status == 403, refused.body
    challenge = refused.headers["www-authenticate"]
    assert 'error="insufficient_scope"' in challenge and 'scope="models:train"' in challenge
    assert 'resource_metadata="https://mcp.example/.well-known/oauth-protected-resource/mcp"' in challenge
    assert refused.body["error"]["code"] == -32600 and "models:train" in refused.body["error"]["message"]
    stepped_up = Client(scoped_api, token=token("alice", scope="mcp models:train"))
    done = stepped_up.call_tool("t_scoped", {"text": "x"}, extension=False)
    assert done.status == 200 and done.result["content"][0]["text"] == "trained x"


def test_a_2025_session_gets_the_same_403_for_a_tool_needing_more_scope(scoped_api: str) -> None:
    http = httpx.Client(timeout=30, headers={"Authorization": f"Bearer {token('alice', scope='mcp')}"})
    base = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-11-25"}
    hello = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}
    init = http.post(
        scoped_api, json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": hello}, headers=base
    )
    session = {**base, "Mcp-Session-Id": init.headers["mcp-session-id"]}
    call = {
        "jsonrpc": "2.0",
        "id": 2,
        "method": "tools/call",
        "params": {"name": "t_scoped", "arguments": {}},
    }
    refused = http.post(scoped_api, json=call, headers=session)
    assert refused.status_code == 403 and 'error="insufficient_scope"' in refused.headers["www-authenticate"]


def test_the_metadata_lists_the_scopes_and_never_follows_the_host_header(scoped_api: str) -> None:
    base = scoped_api.removesuffix("/mcp")
    root = httpx.get(base + "/.well-known/oauth-protected-resource", headers={"Host": "evil.example"}).json()
    inserted = httpx.get(base + "/.well-known/oauth-protected-resource/mcp").json()
    assert root == inserted
    assert root["resource"] == AUDIENCE  # the configured resource (here the URL audience)
    assert {"mcp", "models:train"} <= set(root["scopes_supported"])


def test_a_slow_jwks_fetch_on_delete_never_stalls_the_apis_other_requests(stack: Stack) -> None:
    """The JWT check of every route runs off the event loop (``DELETE /mcp`` once ran it on the
    loop): while one request waits 3 s on a slow issuer, /healthz and others are served."""
    release = threading.Event()

    class Slow(_Jwks):
        def do_GET(self) -> None:
            release.wait(3)
            super().do_GET()

    server = HTTPServer(("127.0.0.1", free_port()), Slow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    env = dict(stack.env, MCP_TASKS_JWT_ISSUER=ISSUER, MCP_TASKS_JWT_AUDIENCE=AUDIENCE,
               MCP_TASKS_JWT_JWKS_URL=f"http://127.0.0.1:{server.server_port}/jwks.json")  # fmt: skip
    proc, url = start_api("jwt-api-slow-jwks", env)
    try:
        deleted: list[httpx.Response] = []
        headers = {"Authorization": f"Bearer {token('alice')}", "Mcp-Session-Id": "no-such-session",
                   "MCP-Protocol-Version": "2025-11-25"}  # fmt: skip
        waiting = threading.Thread(
            target=lambda: deleted.append(httpx.delete(url, headers=headers, timeout=30))
        )
        waiting.start()
        time.sleep(0.5)  # the DELETE is now inside the JWKS fetch
        started = time.monotonic()
        assert httpx.get(url.removesuffix("/mcp") + "/healthz", timeout=5).status_code == 200
        assert time.monotonic() - started < 1.0
        assert waiting.is_alive()  # still waiting on the issuer
        release.set()
        waiting.join(30)
        assert deleted and deleted[0].status_code == 404  # checked, then: no such session
    finally:
        release.set()
        proc.stop()
        server.shutdown()
