"""The project's own app: orders, which its MCP tools read and write through the ORM."""
