"""The window service (DESIGN §3.3, docs/adr/0011-window-service.md): what a session's context window holds,
how much of it is left, and the records every reader of the budget shares.

The strategy rooms sit under it: `proxy/windows/remote/` (the remote protocol, fingerprint, eligibility, store)
and `proxy/windows/notes/` (the bootstrap builder, the rollover store)."""
