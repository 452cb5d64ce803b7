"""Artifacts on a real stack of its own (API with bearer tokens, prefork worker, Redis,
Postgres): a job publishes a 3 MiB file with ``ctx.artifact`` (tests/fixtures/artifacts.py), the
task's result links it, and ``resources/read`` returns the same bytes to its principal only, on
2026-07-28 and on a 2025-11-25 session."""

from __future__ import annotations

import base64
import hashlib
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from mcp_types import jsonrpc as codes

from mcp_celery_tasks.errors import RESOURCE_NOT_FOUND
from tests import support
from tests.e2e.test_principals import _LegacySession
from tests.support import Client, Stack

TOOLS = '["tests.fixtures.conformance", "tests.fixtures.artifacts"]'
TOKENS = {"alice": "alice-art-token", "bob": "bob-art-token"}
SIZE = 3 * 1024 * 1024


@pytest.fixture(scope="module")
def art_stack(template_db: str) -> Iterator[Stack]:
    with support.stack_of_its_own("art", template_db, TOOLS) as stack:
        yield stack


@pytest.fixture(scope="module")
def auth_url(art_stack: Stack) -> Iterator[str]:
    """A second API on the stack with bearer tokens on (the stack's readiness probe is anonymous)."""
    env = dict(art_stack.env, MCP_TASKS_AUTH_TOKENS=json.dumps(TOKENS))
    proc, url = support.start_api(f"art-auth-api-{uuid.uuid4().hex[:8]}", env)
    try:
        yield url
    finally:
        proc.stop()


@pytest.fixture
def alice(auth_url: str) -> Iterator[Client]:
    client = Client(auth_url, token=TOKENS["alice"])
    yield client
    client.close()


@pytest.fixture
def bob(auth_url: str) -> Iterator[Client]:
    client = Client(auth_url, token=TOKENS["bob"])
    yield client
    client.close()


def published(client: Client, tool: str, arguments: dict[str, Any]) -> list[dict[str, Any]]:
    created = client.call_tool(tool, arguments).result
    done = client.wait_status(created["taskId"], timeout=60)
    assert done["status"] == "completed" and done["result"]["isError"] is False, done
    content: list[dict[str, Any]] = done["result"]["content"]
    return content


def read(client: Client, uri: str) -> support.Reply:
    return client.request("resources/read", {"uri": uri}, name=uri)


@pytest.mark.timeout(120)
def test_a_3_mib_artifact_reads_back_whole_to_its_owner_only(alice: Client, bob: Client) -> None:
    link, digest = published(alice, "publish_blob", {"size": SIZE, "name": "weights.bin"})
    assert link["type"] == "resource_link" and link["size"] == SIZE, link
    assert link["mimeType"] == "application/octet-stream" and link["name"] == "weights.bin"

    answer = read(alice, link["uri"]).result
    assert answer["resultType"] == "complete" and answer["cacheScope"] == "private"
    contents = answer["contents"]
    assert [c["uri"] for c in contents] == [link["uri"]] and contents[0]["mimeType"] == link["mimeType"]
    data = base64.b64decode(contents[0]["blob"])
    assert len(data) == SIZE and hashlib.sha256(data).hexdigest() == digest["text"]

    listing = alice.request("resources/list", {}).result
    assert listing["resultType"] == "complete" and listing["cacheScope"] == "private"
    listed = listing["resources"]
    assert link["uri"] in [r["uri"] for r in listed]

    foreign = read(bob, link["uri"]).error
    unknown_uri = link["uri"].replace("/weights.bin", "/other.bin")
    unknown = read(alice, unknown_uri).error
    malformed = read(alice, "mcp-tasks://artifacts/../etc/passwd").error
    # 2026-07-28 (SEP-2164): -32602 "Resource not found", the uri in data; one answer for all three.
    assert foreign == {
        "code": codes.INVALID_PARAMS,
        "message": "Resource not found",
        "data": {"uri": link["uri"]},
    }
    assert unknown == {
        "code": codes.INVALID_PARAMS,
        "message": "Resource not found",
        "data": {"uri": unknown_uri},
    }
    assert malformed["code"] == codes.INVALID_PARAMS and malformed["message"] == "Resource not found"
    assert link["uri"] not in [r["uri"] for r in bob.request("resources/list", {}).result["resources"]]


@pytest.mark.timeout(120)
def test_text_comes_back_as_text_also_on_a_2025_11_25_session(alice: Client, auth_url: str) -> None:
    (link,) = published(alice, "publish_text", {"text": "héllo\nworld\n", "name": "notes.txt"})
    assert link["mimeType"] == "text/plain"
    assert read(alice, link["uri"]).result["contents"] == [
        {"uri": link["uri"], "mimeType": "text/plain", "text": "héllo\nworld\n"}
    ]

    legacy = _LegacySession(auth_url, TOKENS["alice"])
    assert (
        legacy.call("resources/read", {"uri": link["uri"]})["result"]["contents"][0]["text"]
        == "héllo\nworld\n"
    )
    ranged = legacy.call("resources/read", {"uri": f"{link['uri']}?offset=1&length=5"})["result"]
    assert ranged["contents"] == [  # a range is a blob, text or not ("é" is two bytes)
        {"uri": f"{link['uri']}?offset=1&length=5", "mimeType": "text/plain", "blob": base64.b64encode(
            "héllo\nworld\n".encode()[1:6]).decode()}
    ]  # fmt: skip
    bad = legacy.call("resources/read", {"uri": f"{link['uri']}?offset=-1"})["error"]
    assert bad["code"] == codes.INVALID_PARAMS and bad["message"].startswith("Invalid range: ")
    (template,) = legacy.call("resources/templates/list", {})["result"]["resourceTemplates"]
    assert template["uriTemplate"] == "mcp-tasks://artifacts/{id}/{name}{?offset,length}"
    stranger = _LegacySession(auth_url, TOKENS["bob"])
    refused = stranger.call("resources/read", {"uri": link["uri"]})["error"]
    assert refused == {
        "code": RESOURCE_NOT_FOUND,
        "message": "Resource not found",
        "data": {"uri": link["uri"]},
    }


def test_both_revisions_advertise_resources(alice: Client, auth_url: str) -> None:
    assert "resources" in alice.request("server/discover", {}).result["capabilities"]
    legacy = _LegacySession(auth_url, TOKENS["alice"])
    hello = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}
    init = support.parse_body(legacy.post({"method": "initialize", "params": hello}, None))
    assert "resources" in init["result"]["capabilities"]


def test_the_range_template_is_listed_and_a_forged_cursor_is_refused(alice: Client) -> None:
    (template,) = alice.request("resources/templates/list", {}).result["resourceTemplates"]
    assert template["uriTemplate"] == "mcp-tasks://artifacts/{id}/{name}{?offset,length}"
    assert template["name"] == "artifact-range" and "16777216" in template["description"]
    refused = alice.request("resources/list", {"cursor": "not-a-cursor"}).error
    assert refused["code"] == codes.INVALID_PARAMS and refused["message"] == "Invalid cursor"
