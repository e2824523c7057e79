"""`ctproxy pi-config`: the provider entry of Pi's `models.json` that sends Pi's OpenAI traffic through ctproxy.

Pi (npm `@earendil-works/pi-coding-agent` since 1.0; `@mariozechner/pi-coding-agent` up to 0.73.1) ignores
`OPENAI_BASE_URL` for its built-in OpenAI provider, so ctproxy is a provider of its own there:
`api: "openai-responses"`, `baseUrl` the proxy's `/v1`, the API key read from an environment variable (Pi
resolves a bare variable name), and ctproxy's task and agent headers. Pi sends its session id as
`prompt_cache_key`, which keeps each Pi session a session of its own inside that task.

Pi 1.6's compat flags for an OpenAI Responses provider say which request shapes the endpoint takes. ctproxy
passes each of these through to the upstream unchanged (tests/e2e/test_pi_compat.py), so the entry claims exactly
what OpenAI's own model does in Pi's catalog, no more:
- `supportsAdditionalTools` (message-anchored `additional_tools` input items): GPT-5.6 and GPT-6.x models, not
  their `-cyber` variants; ctproxy also reads the tools declared there (proxy/windows/session_tools.py);
- `supportsExplicitPromptCacheMode` (`prompt_cache_options`): GPT-5.6 and GPT-6.x models;
- `supportsLongCacheRetention` (`prompt_cache_retention: "24h"`, or `prompt_cache_options.ttl`): on the
  provider, since ctproxy forwards both fields as sent (Pi would otherwise guess from the loopback URL).

The merge keeps everything else in the file and replaces `providers.ctproxy` whole. Pi also reads JSON with
comments; such a file (or any that is not a JSON object with a `providers` object) is refused, never rewritten.
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

from proxy.errors import CtproxyError
from proxy.usage import model_window

PI_NAME = "ctproxy"  # the provider's key in models.json: `pi --provider ctproxy --model gpt-5`
# What Pi needs to know of a model it cannot look up: OpenAI's reasoning models take images and reason.
_REASONING_PREFIXES = ("gpt-5", "o3", "o4")
# The models Pi 1.6's OpenAI catalog marks for prompt_cache_options, and (not -cyber) for additional_tools.
_NEW_FAMILY = re.compile(r"^gpt-(5\.6|6(\.\d+)?)(-|$)")


class PiMergeError(CtproxyError, ValueError):
    pass


def pi_model(model: str, windows: dict[str, int]) -> dict[str, Any]:
    entry: dict[str, Any] = {"id": model, "input": ["text", "image"]}
    if model.startswith(_REASONING_PREFIXES):
        entry["reasoning"] = True
    if (window := model_window(model, windows)) is not None:
        entry["contextWindow"] = window
    if _NEW_FAMILY.match(model):
        compat: dict[str, Any] = {"supportsExplicitPromptCacheMode": True}
        if not model.endswith("-cyber"):
            compat["supportsAdditionalTools"] = True
        entry["compat"] = compat
    return entry


def pi_provider(*, proxy: str, task: str, agent: str, env_key: str, models: list[str], windows: dict[str, int],
                web_search: str | None = None) -> dict[str, Any]:
    """Pi's provider entry for ctproxy. `web_search` "off"/"on" sends `x-ctp-web-search` on every request."""
    headers = {"x-ctp-task": task, "x-ctp-agent": agent}
    if web_search is not None:
        headers["x-ctp-web-search"] = web_search
    return {"baseUrl": proxy.rstrip("/") + "/v1", "api": "openai-responses", "apiKey": env_key,
            "headers": headers, "compat": {"supportsLongCacheRetention": True},
            "models": [pi_model(m, windows) for m in models]}


def merge_pi_models(existing: str, provider: dict[str, Any]) -> str:
    """`existing` (models.json's text, "" when there is none) with `providers.ctproxy` set to `provider`."""
    if not existing.strip():
        data: dict[str, Any] = {}
    else:
        try:
            data = json.loads(existing)
        except ValueError as exc:
            raise PiMergeError(f"it is not plain JSON ({exc.args[0]}); Pi accepts comments, ctproxy does not "
                               "rewrite a file it would lose them from") from None
        if not isinstance(data, dict):
            raise PiMergeError("it is not a JSON object")
    providers = data.get("providers", {})
    if not isinstance(providers, dict):
        raise PiMergeError("its `providers` is not an object")
    merged = copy.deepcopy(data)
    merged["providers"] = {**providers, PI_NAME: provider}
    return json.dumps(merged, indent=2, ensure_ascii=False) + "\n"
