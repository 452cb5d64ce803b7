"""MCP over JSON-RPC: the building blocks (``rpc``), the method table, dispatch, one handler module
per spec revision (``v2026_07_28``, ``v2025_11_25``), push subscriptions, MRTR rounds (``rounds``),
the synchronous call's relay and the sealed ``requestState``."""
