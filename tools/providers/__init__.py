"""App tool providers beside the built-ins: MCP servers (``mcp``) and HTTP endpoints (``http``).

Each module turns one kind of tools-file section into ``DescribedTool``s;
``tools.toolset`` assembles them into a node's registry.
"""
