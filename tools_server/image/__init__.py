"""`openai_generate_image` (seed 004 §5.3): one image from `gpt-image-2`, saved as a new artifact.

No conversation history is sent: only the prompt and the optional size and quality. An API key goes to
`POST https://api.openai.com/v1/images/generations`, a ChatGPT sign-in to `POST https://chatgpt.com/
backend-api/codex/images/generations` with its `chatgpt-account-id` (a trusted non-official upstream: the
same paths under it). One request, redirects not followed, nothing retried after dispatch, no switching
backend on failure; an abort or timeout after dispatch reports "result unknown". Bytes that are not
PNG or JPEG are an error, not an artifact; a JPEG is converted to PNG with Pillow (the artifact is always
the PNG the tool's description promises; details say `converted_from`). The image is created exclusively
under the state directory's `artifacts/` with a unique name (no caller-chosen path, never an overwrite).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import os
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field

from tools_server import credentials
from tools_server.image.upcall import call_once, read_all, refusal
from tools_server.registry import CallContext, ImageContent, Services, Tool, ToolError, ToolResult

MODEL = "gpt-image-2"
TIMEOUT_SECONDS = 300.0  # one generation (peers: 300 s); fixed, not retried
MAX_ANSWER_BYTES = 64 * 1024 * 1024
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
JPEG_MAGIC = b"\xff\xd8\xff"
FEATURE = "openai_generate_image"
DESCRIPTION = ("Generate one image with OpenAI's gpt-image-2 from a text prompt. Only the prompt is sent (no "
               "conversation history). The image is saved as a new PNG file under ctproxy's artifacts directory; "
               "the result gives its absolute path and the image itself. Not retried: if it fails or is aborted "
               "after sending, the result may be unknown.")


class GenerateImageArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    prompt: str = Field(min_length=1, max_length=32000, description="what the image should show")
    size: str | None = Field(None, pattern=r"^(auto|[1-9][0-9]{1,3}x[1-9][0-9]{1,3})$",
                             description="auto, or WIDTHxHEIGHT such as 1024x1024, 1536x1024, 1024x1536")
    quality: Literal["auto", "low", "medium", "high"] | None = Field(None, description="auto, low, medium or high")


def mime_of(data: bytes) -> str | None:
    if data.startswith(PNG_MAGIC):
        return "image/png"
    if data.startswith(JPEG_MAGIC):
        return "image/jpeg"
    return None


def save_artifact(directory: Path, data: bytes, mime: str) -> Path:
    """Write `data` to a new file with a unique name: written and synced under a temporary name, then linked
    into place (link fails rather than replace an existing file), so no reader ever sees half an image."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    ext = ".png" if mime == "image/png" else ".jpg"
    while True:
        final = directory / f"{uuid.uuid4().hex}{ext}"
        tmp = directory / f".{final.name}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            try:
                os.link(tmp, final)
            except FileExistsError:
                continue  # a uuid4 collision: pick another name, never overwrite
            return final
        finally:
            tmp.unlink(missing_ok=True)


def request_body(args: GenerateImageArgs) -> dict:
    body: dict = {"model": MODEL, "prompt": args.prompt, "n": 1}
    if args.size is not None:
        body["size"] = args.size
    if args.quality is not None:
        body["quality"] = args.quality
    return body


def image_from(body: bytes) -> tuple[bytes, str]:
    """The one image of an `ImagesResponse` and its MIME type; a ToolError when there is none."""
    try:
        data = orjson.loads(body)
        item = data["data"][0]
        b64 = item["b64_json"]
        raw = base64.b64decode(b64, validate=True)
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError, binascii.Error, ValueError):
        raise ToolError(f"{FEATURE}: the upstream's answer holds no image (expected data[0].b64_json); nothing "
                        "was saved", code="upstream_invalid_response") from None
    mime = mime_of(raw)
    if mime is None:
        raise ToolError(f"{FEATURE}: the upstream's image data is not a PNG or JPEG image; nothing was saved",
                        code="upstream_invalid_image")
    return raw, mime


def as_png(raw: bytes) -> bytes:
    """A JPEG answer as a PNG (Pillow), pixels unchanged; a ToolError when it cannot be decoded."""
    import io

    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(raw)) as img:
            img.load()
            out = io.BytesIO()
            img.save(out, "PNG")
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError):
        raise ToolError(f"{FEATURE}: the upstream's JPEG image could not be decoded to save it as a PNG; nothing "
                        "was saved", code="upstream_invalid_image") from None
    return out.getvalue()


class ImageFamily:
    name = "image"

    def __init__(self, services: Services):
        self.services = services

    @property
    def artifacts(self) -> Path:
        return self.services.state.root / "artifacts"

    async def _generate(self, args: GenerateImageArgs, ctx: CallContext) -> ToolResult:
        try:
            target = credentials.resolve(ctx)  # fresh for this dispatch
        except credentials.CredentialsMissing as exc:
            raise ToolError(f"{FEATURE}: {exc}", code="no_credentials") from None

        async def read(answer) -> bytes:
            return await read_all(answer, MAX_ANSWER_BYTES)

        outcome, body = await call_once(ctx, FEATURE, target, "images/generations", request_body(args), read,
                                        TIMEOUT_SECONDS, what="the image request")
        if outcome.status != 200:
            raise refusal(FEATURE, outcome.status, body)
        raw, mime = image_from(body)
        answered = mime
        if mime != "image/png":  # the tool promises a PNG (seed 004 §5.3): converted, never kept as JPEG
            raw, mime = await asyncio.to_thread(as_png, raw), "image/png"
        path = await asyncio.to_thread(save_artifact, self.artifacts, raw, mime)
        details = {"path": str(path), "mime_type": mime, "bytes": len(raw), "model": MODEL,
                   "backend": target.route_kind, "account": target.account, "credential_source": target.source}
        if answered != mime:
            details["converted_from"] = answered
        return ToolResult(text=f"Generated one image with {MODEL}, saved to {path}", details=details,
                          images=[ImageContent(base64.b64encode(raw).decode("ascii"), mime)])

    def tools(self) -> Iterable[Tool]:
        return [Tool(name=FEATURE, description=DESCRIPTION, family=self.name, capability="image_generation",
                     args_model=GenerateImageArgs, execute=self._generate, parallel=True)]

    async def close(self) -> None:
        await self.services.upstream_turns.close()


def create_family(services: Services) -> ImageFamily:
    return ImageFamily(services)
