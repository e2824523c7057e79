"""The companion aiohttp tool server: one registry of locally executed tools, served over REST and MCP."""
