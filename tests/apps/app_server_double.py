"""A faithful double of `codex app-server` for the macOS Computer Use client (no macOS here).

It speaks the app-server's stdio protocol: JSONL JSON-RPC without the `jsonrpc` field, `initialize` →
`initialized` before anything else, `thread/start`, `mcpServerStatus/list`, `mcpServer/tool/call` on the
`node_repl` server's `js` tool, and the server-initiated `mcpServer/elicitation/request` Sky uses for per-app
approval (granted for the process's life when accepted with `_meta.persist: "session"`). It is strict: a
message with `jsonrpc`, a call before the handshake, a thread with anything but node_repl/js, or a source that
is not the fixed template around JSON data is an error. Every message it reads is appended to $CU_DOUBLE_LOG.

$CU_DOUBLE_MODE (comma-separated): crash_on_action (exit mid-call on click/type/key/scroll), hang_on_action
(never answer those), node_repl_failed, jpeg, bad_image (PNG MIME, other bytes), foreign_elicitation (first ask
with a wrong connector_id).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import struct
import sys
import zlib

MODES = set(filter(None, os.environ.get("CU_DOUBLE_MODE", "").split(",")))
LOG = os.environ.get("CU_DOUBLE_LOG")
ACTIONS = {"click", "type_text", "press_key", "scroll"}
SOURCE_HEAD = "const args = JSON.parse("


def log(entry: dict) -> None:
    if LOG:
        with open(LOG, "a", encoding="utf-8") as f:
            f.write(json.dumps(entry) + "\n")


def send(msg: dict) -> None:
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


def png(width: int = 4, height: int = 3) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    raw = b"".join(b"\x00" + b"\xff\x00\x00" * width for _ in range(height))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


class Double:
    def __init__(self) -> None:
        self.initialized = False
        self.handshaken = False
        self.thread: str | None = None
        self.granted: set[str] = set()
        self.next_id = 1000
        self.buffered: list[dict] = []

    def read(self) -> dict | None:
        if self.buffered:
            return self.buffered.pop(0)
        line = sys.stdin.readline()
        if not line:
            return None
        msg = json.loads(line)
        log({"in": msg})
        return msg

    def ask_client(self, method: str, params: dict) -> dict:
        """A server-initiated request; waits for its answer (the client serves one call at a time)."""
        self.next_id += 1
        rid = self.next_id
        send({"id": rid, "method": method, "params": params})
        while True:
            msg = self.read()
            if msg is None:
                sys.exit(0)
            if msg.get("id") == rid and "method" not in msg:
                return msg
            self.buffered.append(msg)

    def serve(self) -> None:
        while (msg := self.read()) is not None:
            if "jsonrpc" in msg:
                send({"id": msg.get("id"), "error": {"code": -32600, "message": "unexpected jsonrpc field"}})
                continue
            method, rid = msg.get("method"), msg.get("id")
            if rid is None:  # a notification
                if method == "initialized" and self.initialized:
                    self.handshaken = True
                continue
            try:
                send({"id": rid, "result": self.handle(method, msg.get("params") or {})})
            except ValueError as exc:
                send({"id": rid, "error": {"code": -32602, "message": str(exc)}})

    def handle(self, method: str, params: dict) -> dict:
        if method == "initialize":
            if not params.get("clientInfo", {}).get("name"):
                raise ValueError("clientInfo.name is required")
            self.initialized = True
            return {"userAgent": "codex-double/0.0.0", "platformFamily": "unix", "platformOs": "macos"}
        if not self.handshaken:
            raise ValueError("Not initialized")
        if method == "thread/start":
            servers = (params.get("config") or {}).get("mcp_servers") or {}
            if set(servers) != {"node_repl"} or servers["node_repl"].get("enabled_tools") != ["js"]:
                raise ValueError("only node_repl with only js is expected")
            if params.get("ephemeral") is not True or params.get("cwd") != os.getcwd():
                raise ValueError("an ephemeral thread in the working directory is expected")
            if os.environ.get("CODEX_HOME") != os.getcwd():
                raise ValueError("CODEX_HOME must be the working directory")
            self.thread = "thr_double_1"
            return {"thread": {"id": self.thread, "ephemeral": True}, "model": "none", "cwd": params["cwd"]}
        if method == "mcpServerStatus/list":
            self.need_thread(params)
            status = "failed" if "node_repl_failed" in MODES else "connected"
            return {"data": [{"name": "node_repl", "runtimeStatus": status, "tools": {"js": {"name": "js"}}}],
                    "nextCursor": None}
        if method == "mcpServer/tool/call":
            self.need_thread(params)
            if params.get("server") != "node_repl" or params.get("tool") != "js":
                raise ValueError("unknown tool")
            return self.js(params.get("arguments") or {})
        raise ValueError(f"unknown method {method}")

    def need_thread(self, params: dict) -> None:
        if self.thread is None or params.get("threadId") != self.thread:
            raise ValueError("thread not found")

    def js(self, arguments: dict) -> dict:
        if set(arguments) != {"code"}:
            raise ValueError("js takes only code")
        code = arguments["code"]
        match = re.match(re.escape(SOURCE_HEAD) + r'("(?:[^"\\]|\\.)*")\);\n', code)
        if not match:
            raise ValueError("not the fixed template")
        data = json.loads(json.loads(match.group(1)))
        log({"template_sha": hashlib.sha256(code.replace(match.group(1), "DATA").encode()).hexdigest()})
        op, args = data["op"], data["params"]
        if op == "list_apps":
            apps = [{"name": "Calculator", "bundleId": "com.apple.calculator", "pid": 501}]
            return {"content": [{"type": "text", "text": "Calculator"}], "structuredContent": {"apps": apps}}
        app = args.get("app", "")
        if app not in self.granted and not self.approve(app):
            return {"content": [{"type": "text", "text": f"Computer Use was not allowed to use {app}"}],
                    "isError": True}
        if op in ACTIONS and "crash_on_action" in MODES:
            os._exit(3)
        if op in ACTIONS and "hang_on_action" in MODES:
            while self.read() is not None:
                pass
            sys.exit(0)
        if op == "get_app_state":
            data = png()
            mime = "image/png"
            if "jpeg" in MODES:
                data, mime = b"\xff\xd8\xff\xe0" + b"\x00" * 16, "image/jpeg"
            if "bad_image" in MODES:
                data = b"GIF89a" + b"\x00" * 16
            return {"content": [{"type": "text", "text": f"{app}\n[0] window \"{app}\"\n  [1] button \"7\""},
                                {"type": "image", "data": base64.b64encode(data).decode(), "mimeType": mime}]}
        return {"content": [{"type": "text", "text": f"{op} done in {app}"}]}

    def approve(self, app: str) -> bool:
        if "foreign_elicitation" in MODES:
            MODES.discard("foreign_elicitation")
            answer = self.elicit(app, connector="some-other-connector")
            log({"foreign_answer": answer.get("result")})
        answer = self.elicit(app, connector="computer-use")
        result = answer.get("result") or {}
        if result.get("action") == "accept" and (result.get("_meta") or {}).get("persist") == "session":
            self.granted.add(app)
            return True
        return result.get("action") == "accept"

    def elicit(self, app: str, connector: str) -> dict:
        return self.ask_client("mcpServer/elicitation/request", {
            "threadId": self.thread, "turnId": None, "serverName": "node_repl", "mode": "form",
            "message": f"Allow Codex to use {app}?", "requestedSchema": {"type": "object", "properties": {}},
            "_meta": {"connector_id": connector, "tool_params": {"app": app}}})


if __name__ == "__main__":
    Double().serve()
