"""The Responses item vocabulary: lazy items, spans, ids, canonical text, classification, rendering,
addresses, the SSE codec (floor plan: docs/adr/0014-the-floor-plan.md)."""
