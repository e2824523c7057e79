"""Pure payload transforms for Responses requests: `(payload, ctx) -> payload`.

Every transform returns the same object when it does not apply, never mutates its input (it
copies what it changes), keeps unknown fields, and is idempotent.
"""
