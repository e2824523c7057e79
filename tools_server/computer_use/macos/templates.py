"""The one JavaScript source every call sends to node_repl's `js` tool. Only its data changes: the
arguments travel as a JSON string literal that the fixed source parses (`JSON.parse`), so nothing the
model sends can become source.

The screenshot is read from the local URL Sky's helper returns; only PNG or JPEG magic is accepted and
the MIME type follows the bytes (the helper returned JPEG in the seed's live probe)."""

from __future__ import annotations

import json
from typing import Any

SOURCE = r"""const args = JSON.parse(__ARGS__);
const sky = await import("@oai/sky");
if (sky.target !== "mac") throw new Error("computer-use: @oai/sky target is not mac");
const result = await sky.service.call(args.op, args.params, { timeoutMs: args.innerTimeoutMs });
const content = [{ type: "text", text: typeof result?.text === "string" ? result.text : "" }];
if (args.op === "get_app_state" && typeof result?.screenshotUrl === "string") {
  const fs = await import("node:fs/promises");
  const bytes = await fs.readFile(new URL(result.screenshotUrl));
  const png = bytes.length > 8 && bytes[0] === 0x89 && bytes[1] === 0x50 && bytes[2] === 0x4e && bytes[3] === 0x47;
  const jpeg = bytes.length > 3 && bytes[0] === 0xff && bytes[1] === 0xd8 && bytes[2] === 0xff;
  if (!png && !jpeg) throw new Error("computer-use: the screenshot is neither PNG nor JPEG");
  content.push({ type: "image", data: bytes.toString("base64"), mimeType: png ? "image/png" : "image/jpeg" });
}
return { content, structuredContent: args.op === "list_apps" ? { apps: result?.apps ?? [] } : undefined };
"""
INNER_TIMEOUT_MS = 120_000  # Sky's own budget for one operation (it may pause it while it waits)


def source_for(op: str, params: dict[str, Any]) -> str:
    data = json.dumps({"op": op, "params": params, "innerTimeoutMs": INNER_TIMEOUT_MS}, ensure_ascii=True)
    return SOURCE.replace("__ARGS__", json.dumps(data, ensure_ascii=True), 1)
