"""This agent as an MCP server for MCP hosts (`taskweaver-lite mcp`).

The other direction, MCP servers whose tools cells call, runs in the kernel: kernel/mcp/launch.py, kernel/mcp/client.py.
"""
