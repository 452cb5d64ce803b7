"""Driven by tests/e2e/test_suspend.py with the Python SDK 1.30 (a 2025-11-25 client): a
synchronous call whose tool asks a question the user answers only after the job suspended.

    python mcp1_suspend_client.py URL TOKEN DELAY_S
"""

from __future__ import annotations

import asyncio
import json
import sys
import warnings

warnings.simplefilter("ignore")

from mcp import ClientSession, types  # noqa: E402
from mcp.client.streamable_http import streamablehttp_client  # noqa: E402


async def main(url: str, token: str, delay_s: float) -> None:
    async def on_elicit(context: object, params: types.ElicitRequestParams) -> types.ElicitResult:
        await asyncio.sleep(delay_s)  # the human thinks; the job gives its slot back meanwhile
        return types.ElicitResult(action="accept", content={"answer": "legacy"})

    headers = {"Authorization": f"Bearer {token}"}
    async with (
        streamablehttp_client(url, headers=headers) as (read, write, _),
        ClientSession(read, write, elicitation_callback=on_elicit) as session,
    ):
        await session.initialize()
        done = await session.call_tool("sp_prework_ask", {"tag": "legacy"})
        print(json.dumps({"text": done.content[0].text, "isError": done.isError}), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], float(sys.argv[3])))
