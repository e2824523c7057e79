"""mitmproxy plumbing: the flow's body and state, streaming, batched sends, raw headers, the loopback
endpoints (floor plan: docs/adr/0014-the-floor-plan.md)."""
