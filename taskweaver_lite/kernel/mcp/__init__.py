"""The MCP client a kernel runs: `mcp.servers` started as the kernel's children, each a namespace of tools a cell calls."""
