"""Codex CLI's `config.toml` entries that route it through ctproxy (`ctproxy codex-config`), rendered as TOML
and merged into an existing file without touching the user's other tables (pure: no file is read or written here)."""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING

from proxy.errors import CtproxyError

if TYPE_CHECKING:
    pass


CODEX_NAME = "ctproxy"  # the key of the provider and of the MCP server in Codex's config.toml
DEFAULT_PROXY = "http://127.0.0.1:8787"
DEFAULT_TOOLS = "http://127.0.0.1:8788"


def toml_str(value: str) -> str:
    return json.dumps(value)  # a JSON string (ASCII, \u escapes) is a valid TOML basic string


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return toml_str(value)
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{toml_str(k)} = {_toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(type(value).__name__)


def codex_entries(*, proxy: str, tools: str | None, token: str | None, token_env: str | None, task: str,
                  agent: str, env_key: str, chatgpt: bool, web_search: str | None = None,
                  remote_compaction: str | None = None) -> dict[str, object]:
    """The Codex CLI (0.171; 0.169 reads them too) settings that route it through ctproxy, as the dict `tomllib`
    reads back. `web_search`: the per-client search switch (`x-ctp-web-search: off|on` on the model requests).
    `remote_compaction`: the provider capability (`v2` | `unsupported`); Codex keeps its provider default without
    it (local compaction, since ctproxy's provider is not named "OpenAI")."""
    ident = {"x-ctp-task": task, "x-ctp-agent": agent}
    provider: dict[str, object] = {"name": "ctproxy", "wire_api": "responses"}
    if chatgpt:  # the ChatGPT login's token goes to chatgpt.com/backend-api/codex, through ctproxy
        provider |= {"base_url": proxy.rstrip("/") + "/backend-api/codex", "requires_openai_auth": True}
    else:
        provider |= {"base_url": proxy.rstrip("/") + "/v1", "env_key": env_key}
    provider["http_headers"] = dict(ident) | ({"x-ctp-web-search": web_search} if web_search else {})
    if remote_compaction is not None:
        provider["capabilities"] = {"remote_compaction": remote_compaction}
    entries: dict[str, object] = {"model_provider": CODEX_NAME, "model_providers": {CODEX_NAME: provider}}
    if tools:
        server: dict[str, object] = {"url": tools.rstrip("/") + "/mcp"}
        if token_env:
            server["bearer_token_env_var"] = token_env
            server["http_headers"] = dict(ident)
        else:
            server["http_headers"] = {"Authorization": f"Bearer {token}", **ident}
        # Codex asks before running an MCP tool that may write; `codex exec` cannot ask, so without this every
        # such call fails with "MCP tool call requires approval, but approval policy is never".
        server["default_tools_approval_mode"] = "approve"
        entries["mcp_servers"] = {CODEX_NAME: server}
    return entries


def render_codex_tables(entries: dict[str, object]) -> list[str]:
    """The `[model_providers.ctproxy]` and `[mcp_servers.ctproxy]` tables (no top-level keys)."""
    lines: list[str] = []
    for table in ("model_providers", "mcp_servers"):
        body = entries.get(table)
        if not isinstance(body, dict):
            continue
        lines += ["", f"[{table}.{CODEX_NAME}]"]
        if table == "mcp_servers":
            lines.append("# ctproxy's tool server over MCP; the approval mode lets `codex exec` run its tools")
        lines += [f"{k} = {_toml_value(v)}" for k, v in body[CODEX_NAME].items()]
    return lines


_HEADER = re.compile(r"^\s*\[(?!\[)\s*([^\[\]]+?)\s*\](?:\s*#.*)?\s*$")
_ARRAY_HEADER = re.compile(r"^\s*\[\[")
_MODEL_PROVIDER = re.compile(r"^\s*(model_provider|\"model_provider\"|'model_provider')\s*=")


def _ours(header: str) -> bool:
    key = re.sub(r"[\s\"']", "", header)
    return any(key == f"{t}.{CODEX_NAME}" or key.startswith(f"{t}.{CODEX_NAME}.")
               for t in ("model_providers", "mcp_servers"))


class CodexMergeError(CtproxyError, ValueError):
    pass


def merge_codex_config(existing: str, entries: dict[str, object]) -> str:
    """`existing` with the top-level `model_provider` set and the ctproxy tables replaced (or added); every
    other line kept as it was. Checked by reading the result back: it must equal the old settings with
    exactly these changes, else CodexMergeError (then nothing should be written)."""
    import copy
    import tomllib

    try:
        before = tomllib.loads(existing)
    except tomllib.TOMLDecodeError as exc:
        raise CodexMergeError(f"it is not valid TOML ({exc})") from None
    lines = existing.splitlines()
    kept: list[str] = []
    skipped: list[str] = []
    skipping = False
    first_header: int | None = None

    def give_back_trailing_comments() -> None:
        # Comments (and blank lines) at the end of a removed table belong to what follows it.
        tail: list[str] = []
        while skipped and (not skipped[-1].strip() or skipped[-1].lstrip().startswith("#")):
            tail.insert(0, skipped.pop())
        kept.extend(tail)
        skipped.clear()

    for line in lines:
        m = _HEADER.match(line)
        if m or _ARRAY_HEADER.match(line):
            if skipping:
                give_back_trailing_comments()
            skipping = bool(m) and _ours(m.group(1))
            if not skipping and first_header is None:
                first_header = len(kept)
        (skipped if skipping else kept).append(line)
    if skipping:
        give_back_trailing_comments()
    top_end = first_header if first_header is not None else len(kept)
    provider_line = f"model_provider = {toml_str(CODEX_NAME)}"
    for i in range(top_end):
        if _MODEL_PROVIDER.match(kept[i]):
            kept[i] = provider_line
            break
    else:
        insert = [provider_line]
        while top_end > 0 and not kept[top_end - 1].strip():
            top_end -= 1  # before the blank lines that separate the top level from the first table
        kept[top_end:top_end] = insert
    while kept and not kept[-1].strip():
        kept.pop()
    merged = "\n".join([*kept, *render_codex_tables(entries)]).lstrip("\n") + "\n"

    expected = copy.deepcopy(before)
    expected["model_provider"] = CODEX_NAME
    for table in ("model_providers", "mcp_servers"):
        section = expected.get(table)
        if isinstance(section, dict):
            section.pop(CODEX_NAME, None)
        if table in entries:
            expected.setdefault(table, {})[CODEX_NAME] = entries[table][CODEX_NAME]  # type: ignore[index]
    try:
        after = tomllib.loads(merged)
    except tomllib.TOMLDecodeError as exc:
        raise CodexMergeError(f"its layout could not be merged line by line ({exc})") from None
    for data in (after, expected):  # a table left empty by removing ctproxy's entry may or may not remain
        for table in ("model_providers", "mcp_servers"):
            if data.get(table) == {}:
                data.pop(table)
    if after != expected:
        raise CodexMergeError("its layout could not be merged line by line (ctproxy settings outside "
                              f"[model_providers.{CODEX_NAME}] / [mcp_servers.{CODEX_NAME}] tables?)")
    return merged
