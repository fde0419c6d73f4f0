"""The Model Context Protocol both ways: `taskweaver-lite mcp` serves MCP hosts (server.py); `mcp.servers` gives cells MCP tools (launch.py, client.py)."""
