"""A team's own FastAPI service that serves MCP under ``/mcp`` (tests/e2e/test_embedding.py)."""
