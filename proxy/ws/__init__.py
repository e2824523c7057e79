"""The Responses WebSocket adapter (ADR 0009, docs/websocket.md): the client's socket ends in ctproxy, each
`response.create` runs through the one addon chain as a `POST …/responses` flow, and the chain's answer goes
back as frames; ctproxy's own socket toward the upstream is `proxy.upstream.ws`."""

from proxy.ws.server import PATH_PREFIX, UP_PREFIX, WsJob, WsService, agent_path

__all__ = ["PATH_PREFIX", "UP_PREFIX", "WsJob", "WsService", "agent_path"]
