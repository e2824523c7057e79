"""Addons that only `ctproxy up` adds: recording flows (`--record`) and answering replay misses."""

from __future__ import annotations

from pathlib import Path
from typing import BinaryIO

import orjson
from mitmproxy import http, io

from proxy.host.flowstate import state_of
from proxy.routes import CREDENTIAL_HEADERS


class RecordFlows:
    """Writes each finished flow with mitmproxy's FlowWriter, including the client's original request
    body (`ctp.client_request`) so `--server-replay` can match on what the client sent."""

    def __init__(self, path: Path):
        self.path = path
        self._fh: BinaryIO | None = None
        self._writer: io.FlowWriter | None = None

    def running(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = self.path.open("ab")
        self._writer = io.FlowWriter(self._fh)

    def _write(self, flow: http.HTTPFlow) -> None:
        if self._writer is None or self._fh is None:
            return
        original = state_of(flow).client_request
        saved = flow.copy()
        if isinstance(original, bytes):
            saved.metadata["ctp.client_request"] = original
        # A recording is a file people share: credentials never go into it.
        for name in [k for k in saved.request.headers if k.lower() in CREDENTIAL_HEADERS]:
            saved.request.headers[name] = "<redacted>"
        if saved.response is not None:
            for name in [k for k in saved.response.headers if k.lower() == "set-cookie"]:
                saved.response.headers[name] = "<redacted>"
        self._writer.add(saved)
        self._fh.flush()

    def response(self, flow: http.HTTPFlow) -> None:
        self._write(flow)

    def error(self, flow: http.HTTPFlow) -> None:
        self._write(flow)

    def done(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


class ReplayMiss:
    """With `--server-replay`, a request no recorded flow matches gets a clear 502, never a hang."""

    def request(self, flow: http.HTTPFlow) -> None:
        if flow.response is not None or flow.is_replay == "response":
            return
        body = {"error": {
            "type": "server_replay_miss",
            "code": "server_replay_miss",
            "param": None,
            "message": f"ctproxy --server-replay: no recorded flow matches {flow.request.method} "
                       f"{flow.request.path.split('?', 1)[0]} with this body; record it first or check the "
                       "matching rules in docs/replay.md",
        }}
        flow.response = http.Response.make(502, orjson.dumps(body), {"content-type": "application/json"})
