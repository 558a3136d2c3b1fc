"""What runs tools inside a tool host: standard tools, MCP servers. Host process only."""
