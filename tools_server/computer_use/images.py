"""Screenshot bytes are PNG or JPEG, told by their magic bytes; the MIME type always matches them."""

from __future__ import annotations

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
JPEG_MAGIC = b"\xff\xd8\xff"


def sniff_mime(data: bytes) -> str | None:
    """`image/png`, `image/jpeg`, or None for anything else (which is never passed on)."""
    if data.startswith(PNG_MAGIC):
        return "image/png"
    if data.startswith(JPEG_MAGIC):
        return "image/jpeg"
    return None
