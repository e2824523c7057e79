"""Canonical safe text of a journal item (pure): what list/search/read show and search matches.

The text is built from the item's parts. Only real content (message text, tool arguments and
outputs, shell output, search queries) is searchable; placeholders (images, reasoning, opaque
compaction items, call headers) are shown but excluded from matching, and no match may span two
parts (`segments` are the searchable code-point ranges). Reasoning content, encrypted content and
image bytes never enter the text; images are described, and `images` lists them for read_item.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import orjson

from proxy.items.canonical import COMPACTION_TYPES, item_type

PART_SEPARATOR = "\n"
_DATA_URL = re.compile(r"data:(?P<mime>[\w.+-]+/[\w.+-]+)?(?:;[^,;]*)*;base64,", re.ASCII)


@dataclass(frozen=True)
class ImageRef:
    kind: str  # data | url | file
    mime: str | None = None
    data_base64: str | None = None  # for kind == "data"
    url: str | None = None
    file_id: str | None = None
    detail: str | None = None

    def describe(self, n: int) -> str:
        if self.kind == "data":
            size = len(self.data_base64 or "") * 3 // 4
            return f"[image #{n}: {self.mime or 'image'}, {size} bytes; read this item to see it]"
        if self.kind == "url":
            return f"[image #{n}: {self.url}]"
        return f"[image #{n}: file {self.file_id}]"


@dataclass
class Rendered:
    text: str = ""
    segments: list[tuple[int, int]] = field(default_factory=list)
    images: list[ImageRef] = field(default_factory=list)

    def add(self, piece: str, searchable: bool = True) -> None:
        if not piece:
            return
        if self.text:
            self.text += PART_SEPARATOR
        start = len(self.text)
        self.text += piece
        if searchable:
            self.segments.append((start, len(self.text)))

    def add_image(self, ref: ImageRef) -> None:
        self.images.append(ref)
        self.add(ref.describe(len(self.images)), searchable=False)


def image_ref(url: Any, file_id: Any = None, detail: Any = None) -> ImageRef | None:
    if isinstance(url, str) and url:
        m = _DATA_URL.match(url)
        if m:
            return ImageRef("data", mime=m.group("mime"), data_base64=url[m.end():],
                            detail=detail if isinstance(detail, str) else None)
        return ImageRef("url", url=url, detail=detail if isinstance(detail, str) else None)
    if isinstance(file_id, str) and file_id:
        return ImageRef("file", file_id=file_id)
    return None


def _render_part(out: Rendered, part: Any) -> None:
    if isinstance(part, str):
        out.add(part)
        return
    if not isinstance(part, dict):
        return
    typ = part.get("type")
    if typ in ("input_text", "output_text", "text", "summary_text") and isinstance(part.get("text"), str):
        out.add(part["text"])
    elif typ == "refusal":
        out.add("[refusal]", searchable=False)
        out.add(str(part.get("refusal") or ""))
    elif typ in ("input_image", "image", "computer_screenshot"):
        url = part.get("image_url")
        if isinstance(url, dict):  # chat-style {"url": …}
            url = url.get("url")
        ref = image_ref(url, part.get("file_id"), part.get("detail"))
        if ref is not None:
            out.add_image(ref)
    elif typ == "input_file":
        name = part.get("filename") or part.get("file_id") or part.get("file_url") or "attachment"
        out.add(f"[file: {name}]", searchable=False)
    elif typ == "encrypted_content":
        out.add("[encrypted content]", searchable=False)
    else:
        out.add(f"[{typ or 'unknown'} part]", searchable=False)


def _render_content(out: Rendered, content: Any) -> None:
    if isinstance(content, str):
        out.add(content)
    elif isinstance(content, list):
        for part in content:
            _render_part(out, part)


def _json(value: Any) -> str:
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        return str(value)


def _render_web_search(out: Rendered, item: dict[str, Any]) -> None:
    out.add("[web search]", searchable=False)
    action = item.get("action") if isinstance(item.get("action"), dict) else {}
    queries = action.get("queries") or ([action["query"]] if isinstance(action.get("query"), str) else [])
    for q in queries:
        if isinstance(q, str):
            out.add(q)
    for key in ("url", "pattern"):
        if isinstance(action.get(key), str):
            out.add(action[key])
    for src in action.get("sources") or []:
        if isinstance(src, dict) and isinstance(src.get("url"), str):
            out.add(src["url"])


def render_item(item: Any) -> Rendered:
    out = Rendered()
    if not isinstance(item, dict):
        out.add(str(item))
        return out
    typ = item_type(item)
    if typ == "message":
        _render_content(out, item.get("content"))
    elif typ in ("function_call", "custom_tool_call"):
        ns, name = item.get("namespace"), item.get("name")
        out.add(f"[call {ns + '.' if isinstance(ns, str) and ns else ''}{name}]", searchable=False)
        body = item.get("arguments") if typ == "function_call" else item.get("input")
        out.add(body if isinstance(body, str) else _json(body))
    elif typ in ("function_call_output", "custom_tool_call_output", "local_shell_call_output",
                 "shell_call_output", "apply_patch_call_output", "computer_call_output"):
        output = item.get("output")
        if typ == "computer_call_output" and isinstance(output, dict):
            _render_part(out, output)
        elif typ == "shell_call_output" and isinstance(output, list):
            for chunk in output:
                if isinstance(chunk, dict):
                    for key in ("stdout", "stderr"):
                        if isinstance(chunk.get(key), str):
                            out.add(chunk[key])
        elif isinstance(output, str | list):
            _render_content(out, output)
        elif output is not None:
            out.add(_json(output))
        if not out.text:
            out.add("[empty tool result]", searchable=False)
    elif typ == "reasoning":
        out.add("[reasoning: content not recorded as text]", searchable=False)
    elif typ in COMPACTION_TYPES:
        size = len(item.get("encrypted_content") or "")
        out.add(f"[compaction item: opaque, {size} chars]", searchable=False)
    elif typ == "web_search_call":
        _render_web_search(out, item)
    elif typ == "image_generation_call":
        out.add("[image generation]", searchable=False)
        if isinstance(item.get("revised_prompt"), str):
            out.add(item["revised_prompt"])
        if isinstance(item.get("result"), str) and item["result"]:
            out.add_image(ImageRef("data", mime="image/png", data_base64=item["result"]))
    elif typ in ("local_shell_call", "shell_call", "computer_call", "apply_patch_call"):
        out.add(f"[{typ}]", searchable=False)
        action = item.get("action") if "action" in item else item.get("operation")
        if isinstance(action, dict) and isinstance(action.get("command"), list):
            out.add(" ".join(str(c) for c in action["command"]))
        elif isinstance(action, dict) and isinstance(action.get("commands"), list):
            for c in action["commands"]:
                out.add(str(c))
        elif action is not None:
            out.add(_json(action))
    elif typ == "mcp_call":
        out.add(f"[mcp call {item.get('server_label')}.{item.get('name')}]", searchable=False)
        for key in ("arguments", "output"):
            if isinstance(item.get(key), str) and item[key]:
                out.add(item[key])
        error = item.get("error")
        if isinstance(error, str) and error:
            out.add(error)
        elif isinstance(error, dict):  # the API's MCPToolCallError: {type, content: [{type: text, text}]}
            content = error.get("content")
            if isinstance(content, str | list) and content:
                _render_content(out, content)
            else:
                out.add(_json(error))
    elif typ == "item_reference":
        out.add(f"[reference to stored item {item.get('id')}]", searchable=False)
    else:
        out.add(f"[{typ} item]", searchable=False)
        rest = {k: v for k, v in item.items() if k not in ("id", "type", "encrypted_content", "result")}
        if rest:
            out.add(_json(rest))
    return out
