"""Context windows (seed 000, issue 13): the pending rollover store and the pure bootstrap builder.

The projection stage (`addons/context.py`) consumes a pending rollover at the session's next forwarded
sampling request and forwards the window's bootstrap; see docs/context.md for how it calls these.
"""
