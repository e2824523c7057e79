"""The tool bridge (issue 12, docs/bridge.md, ADR 0007): the proxy offers the tool server's tools to any agent
and runs the model's calls to them itself, so the agent sees one response.

Pure parts: `specs` (which tools, in which form, appended byte-stably), `items` (executed calls as
`mcp_call` items, and the next request made valid upstream again), `merge` (one lifecycle out of several
upstream rounds). I/O: `turn` (the rounds, through the upstream-turn service and the tool client) and
`server` (the loopback endpoint mitmproxy streams a bridged answer from).
"""
