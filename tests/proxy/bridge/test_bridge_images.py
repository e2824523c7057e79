"""Images in a bridged call's output (issues 15, 16): a bridged `openai_generate_image` against the
emulator's Images API; the next upstream round's input carries the picture as an `input_image` part of the
`function_call_output` (validated against the OpenAPI description), the agent sees an `mcp_call` with the
text (the path), and the artifact is the emulator's PNG."""

from __future__ import annotations

import base64

import openai
import pytest

from tests.emulator import FunctionCall, Text
from tests.emulator.images import png_bytes
from tests.openapi_schema import spec_available, validate

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("stream", [True, False])
async def test_bridged_image_reaches_the_model_as_input_image(emulator, proxy_factory, monkeypatch, stream):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    proxy = await proxy_factory(upstream=emulator.url, extra_args=[
        "--bridge", "image_generation", "--enable", "image_generation"], env={"OPENAI_API_KEY": ""})
    c = openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="sk-test-bridge-image-0123456789", max_retries=0)
    emulator.script(FunctionCall("openai_generate_image", {"prompt": "a red square"}, call_id="call_img"),
                    Text("here it is"))
    if stream:
        async with c.responses.stream(model="gpt-4.1", input="draw a red square") as s:
            final = await s.get_final_response()
    else:
        final = await c.responses.create(model="gpt-4.1", input="draw a red square")
    await c.close()
    assert final.output_text == "here it is"
    shown = final.output[0]
    assert shown.type == "mcp_call" and shown.status == "completed", shown
    assert [r.route for r in emulator.requests].count("images") == 1
    _first, second = emulator.responses_requests
    out = next(i for i in second.json["input"] if i.get("type") == "function_call_output")
    assert out["call_id"] == "call_img" and isinstance(out["output"], list)
    kinds = [p["type"] for p in out["output"]]
    assert kinds == ["input_text", "input_image"]
    image = out["output"][1]
    prefix = "data:image/png;base64,"
    assert image["image_url"].startswith(prefix) and image["detail"] == "auto"
    assert base64.b64decode(image["image_url"][len(prefix):]) == png_bytes()
    assert "artifacts" in out["output"][0]["text"]  # the text part names the artifact's path
    assert (shown.output or "") == out["output"][0]["text"]  # the agent sees the text, not the base64
    if spec_available():
        validate("CreateResponse", second.json)
