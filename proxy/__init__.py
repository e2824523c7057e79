"""ctproxy core: configuration, routes, session identity, SSE codec, state and the launcher."""

__version__ = "0.1.0"
