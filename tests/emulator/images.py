"""The Images API of the emulator: `POST /v1/images/generations` and `POST /backend-api/codex/images/generations`.

    images = images_of(emu)          # the emulator's image endpoint settings
    images.mode = "png"              # a valid PNG (default) | "jpeg" | "broken_jpeg" (undecodable) | "error" (400)
                                     # | "not_image" (bytes that are no image) | "redirect" (302)
                                     # | "stall" (silent until the client leaves)

Requests are recorded in `emu.requests` with route "images". A request is checked as upstream would: an
`Authorization` bearer (401 otherwise), the Codex route also `chatgpt-account-id`, and the body against
`CreateImageRequest` of the OpenAPI description when it is available (400 with the violation otherwise).
The answer is an `ImagesResponse` (`created`, `data[0].b64_json`, `usage`, …).
"""

from __future__ import annotations

import base64
import struct
import time
import weakref
import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiohttp import web

from .render import error_plan, json_plan

if TYPE_CHECKING:
    from .app import Emulator

ROUTE = "images"
PATHS = ("/v1/images/generations", "/backend-api/codex/images/generations")


def png_bytes(width: int = 4, height: int = 4, rgb: tuple[int, int, int] = (200, 40, 90)) -> bytes:
    """A real PNG (IHDR, one zlib IDAT, IEND, CRCs right), decodable by any image library."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    row = b"\x00" + bytes(rgb) * width
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(row * height))
            + chunk(b"IEND", b""))


def jpeg_bytes(width: int = 4, height: int = 4, rgb: tuple[int, int, int] = (200, 40, 90)) -> bytes:
    """A real, decodable JPEG (Pillow): what the upstream may answer instead of a PNG."""
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (width, height), rgb).save(out, "JPEG", quality=95)
    return out.getvalue()


# Only the magic and a JFIF header, no image in it: an answer that claims JPEG and cannot be decoded.
BROKEN_JPEG_BYTES = b"\xff\xd8\xff\xe0\x00\x10JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00\xff\xd9"


@dataclass
class Images:
    mode: str = "png"
    revised_prompt: bool = True


_settings: weakref.WeakKeyDictionary[Any, Images] = weakref.WeakKeyDictionary()


def images_of(emu: Emulator) -> Images:
    if emu not in _settings:
        _settings[emu] = Images()
    return _settings[emu]


def _answer(body: dict[str, Any], image: bytes, fmt: str) -> dict[str, Any]:
    out: dict[str, Any] = {
        "created": int(time.time()),
        "data": [{"b64_json": base64.b64encode(image).decode("ascii")}],
        "background": "opaque",
        "output_format": fmt,
        "size": body.get("size") if body.get("size") not in (None, "auto") else "1024x1024",
        "quality": body.get("quality") if body.get("quality") not in (None, "auto") else "medium",
        "usage": {"input_tokens": 12, "output_tokens": 1056, "total_tokens": 1068,
                  "input_tokens_details": {"text_tokens": 12, "image_tokens": 0}},
    }
    return out


def _check(request: web.Request, body: dict[str, Any]):
    auth = request.headers.get("Authorization", "")
    if not auth.lower().startswith("bearer ") or not auth[7:].strip():
        return error_plan(401, "You didn't provide an API key. You need to provide your API key in an "
                          "Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).",
                          "invalid_request_error")
    if request.path.startswith("/backend-api/codex") and not request.headers.get("chatgpt-account-id"):
        return error_plan(401, "Missing chatgpt-account-id", "invalid_request_error")
    from ..openapi_schema import schema_errors, spec_available

    if spec_available() and (problems := schema_errors("CreateImageRequest", body)):
        return error_plan(400, f"Invalid request: {problems[0]}", "invalid_request_error")
    return None


def add_routes(app: web.Application, emu: Emulator) -> None:
    async def generate(request: web.Request) -> web.StreamResponse:
        rec, error = await emu._parsed(request, ROUTE)
        if error is not None:
            return await emu._send(request, rec, error)
        body: dict[str, Any] = rec.json
        if (error := _check(request, body)) is not None:
            return await emu._send(request, rec, error)
        mode = images_of(emu).mode
        if mode == "error":
            plan = error_plan(400, "Your request was rejected as a result of our safety system.",
                              "image_generation_user_error", code="moderation_blocked")
        elif mode == "redirect":
            plan = json_plan({"moved": True}, status=302)
            plan.headers.append(("Location", "https://example.invalid/elsewhere"))
        elif mode == "not_image":
            plan = json_plan(_answer(body, b"<html>not an image</html>", "png"))
        elif mode == "jpeg":
            plan = json_plan(_answer(body, jpeg_bytes(), "jpeg"))
        elif mode == "broken_jpeg":
            plan = json_plan(_answer(body, BROKEN_JPEG_BYTES, "jpeg"))
        else:
            plan = json_plan(_answer(body, png_bytes(), "png"))
            plan.stall_before_headers = mode == "stall"
        return await emu._send(request, rec, plan)

    for path in PATHS:
        app.router.add_post(path, generate)
