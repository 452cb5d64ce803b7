"""What today's hosts and the conformance suite need beyond tasks: ``x-mcp-header`` arguments
mirrored in ``Mcp-Param-*`` headers (SEP-2243), hand-written JSON Schema 2020-12 keywords kept
in tools/list, and ``inputResponses`` offered with the first request (SEP-2322)."""

from __future__ import annotations

import base64
from typing import Any

from mcp_types import jsonrpc as codes

from tests.support import Client, Reply, meta


def call(client: Client, arguments: dict[str, Any], **headers: str) -> Reply:
    return client.request(
        "tools/call", {"name": "test_custom_header", "arguments": arguments}, extension=False, headers=headers
    )


def test_an_x_mcp_header_argument_must_be_mirrored_in_its_header(client: Client) -> None:
    assert call(client, {"region": "eu-1"}, **{"Mcp-Param-Region": "eu-1"}).result["content"][0]["text"] == (
        "region: eu-1"
    )
    encoded = "=?base64?" + base64.b64encode("zürich".encode()).decode() + "?="
    assert call(client, {"region": "zürich"}, **{"Mcp-Param-Region": encoded}).status == 200
    for headers in ({}, {"Mcp-Param-Region": "us-2"}, {"Mcp-Param-Region": "=?base64?SGVsbG8?="}):
        refused = call(client, {"region": "eu-1"}, **headers)
        assert refused.status == 400 and refused.error["code"] == codes.HEADER_MISMATCH, headers


def test_tools_list_keeps_hand_written_json_schema_keywords(client: Client) -> None:
    tools = {t["name"]: t for t in client.request("tools/list").result["tools"]}
    schema = tools["json_schema_2020_12_tool"]["inputSchema"]
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["$defs"]["address"]["$anchor"] == "addressDef"
    assert schema["properties"]["address"] == {"$ref": "#/$defs/address"}
    assert {"allOf", "if", "then", "else"} <= set(schema) and schema["additionalProperties"] is False
    assert tools["test_custom_header"]["inputSchema"]["properties"]["region"]["x-mcp-header"] == "Region"


def test_answers_offered_with_the_first_request_skip_the_round(client: Client) -> None:
    offered = {
        "user_name": {"action": "accept", "content": {"name": "Ada"}},
        "never_asked": {"action": "accept", "content": {}},
    }
    reply = client.request(
        "tools/call",
        {
            "name": "test_input_required_result_elicitation",
            "arguments": {},
            "inputResponses": offered,
            "_meta": meta(False, elicitation={}),
        },
        extension=False,
    )
    assert reply.result["resultType"] == "complete" and reply.result["content"][0]["text"] == "Hello, Ada!"
    wrong = {"user_name": {"action": "accept", "content": {"name": 5}}}
    reply = client.request(
        "tools/call",
        {
            "name": "test_input_required_result_elicitation",
            "arguments": {},
            "inputResponses": wrong,
            "_meta": meta(False, elicitation={}),
        },
        extension=False,
    )
    assert reply.result["resultType"] == "input_required" and "user_name" in reply.result["inputRequests"]
