"""Remote compaction v2 (seed 004 §5.2) and overflow recovery: the decision, the remote clients,
the dual-representation store and the fingerprints that gate replay of opaque items."""
