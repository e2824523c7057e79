"""Agent addresses inside a task (seed 000): `/root`, then segments of `[a-z0-9_]`.

No empty segment, `.`, `..` or a nested `root`; relative names resolve under a base agent.
An agent that joins without a name gets the stable `/root/agent_<hash>` of its session key.
"""

from __future__ import annotations

import re

from proxy.errors import CtproxyError
from proxy.items.canonical import sha256

ROOT = "/root"
_SEGMENT = re.compile(r"[a-z0-9_]+")


class AddressError(CtproxyError, ValueError):
    """An address the model or the client got wrong; the message says what is allowed."""


def _check_segments(segments: list[str], shown: str) -> None:
    for seg in segments:
        if seg in ("", ".", ".."):
            raise AddressError(f"invalid agent address {shown!r}: empty, '.' and '..' segments are not allowed")
        if seg == "root":
            raise AddressError(f"invalid agent address {shown!r}: 'root' may only be the first segment")
        if not _SEGMENT.fullmatch(seg):
            raise AddressError(
                f"invalid agent address {shown!r}: segments use only lower-case letters, digits and '_'"
            )


def validate_address(address: str) -> str:
    """Return the absolute address unchanged if valid, else raise AddressError."""
    if not isinstance(address, str) or not address.startswith("/"):
        raise AddressError(f"invalid agent address {address!r}: absolute addresses start with /root")
    parts = address.split("/")[1:]
    if not parts or parts[0] != "root":
        raise AddressError(f"invalid agent address {address!r}: absolute addresses start with /root")
    _check_segments(parts[1:], address)
    return address


def resolve_address(name: str | None, base: str = ROOT) -> str:
    """Absolute names resolve as given; relative ones (`reviewer`, `a/b`) under `base`."""
    if name is None:
        return validate_address(base)
    name = name.strip()
    if name.startswith("/"):
        return validate_address(name)
    if not name:
        raise AddressError("empty agent name: omit it for the current agent, or give a name like 'reviewer'")
    segments = name.split("/")
    _check_segments(segments, name)
    return validate_address(base.rstrip("/") + "/" + "/".join(segments))


def auto_address(session_key: str) -> str:
    """The stable address of an agent that joined a task without a name."""
    return f"{ROOT}/agent_{sha256(session_key.encode('utf-8')).hexdigest()[:12]}"


def address_hash(address: str) -> str:
    """Directory name for an agent's files (notes): stable, filesystem-safe."""
    return sha256(address.encode("utf-8")).hexdigest()[:16]
