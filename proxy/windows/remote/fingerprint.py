"""Compatibility fingerprints of a compaction: provider kind, model, normalised endpoint, auth kind
and a keyed hash of the account. The credential itself is never stored; the hash key lives in the
state directory (mode 0600) so the hash cannot be recomputed from a leaked database alone.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import orjson
from filelock import FileLock

from proxy.files import atomic_write_bytes

KEY_FILE = "compaction-account.key"
_UNKNOWN_AUTH = ("none", "unknown")


@dataclass(frozen=True)
class Fingerprint:
    provider_kind: str  # api | codex
    model: str
    endpoint: str  # scheme://host[:port]/prefix, lower-case host, default port omitted
    auth_kind: str  # api_key | oauth | bearer | none
    account_hash: str  # HMAC-SHA256 of the account identity, hex; "" when there is none


def compatible(stored: Fingerprint, current: Fingerprint) -> bool:
    """Opaque items replay only when everything matches and the identity is known."""
    if stored.auth_kind in _UNKNOWN_AUTH or not stored.account_hash:
        return False
    return (
        stored.provider_kind == current.provider_kind
        and stored.model == current.model
        and stored.endpoint == current.endpoint
        and stored.auth_kind == current.auth_kind
        and hmac.compare_digest(stored.account_hash, current.account_hash)
    )


@functools.lru_cache(maxsize=256)  # (asked of every request; a process talks to a handful of endpoints)
def normalise_endpoint(scheme: str, host: str, port: int, path: str) -> str:
    """The API base of a request: origin + the path up to and including /v1 or /backend-api/codex."""
    scheme = scheme.lower()
    host = host.lower().rstrip(".")
    default = 443 if scheme == "https" else 80
    netloc = host if port == default else f"{host}:{port}"
    p = path.split("?", 1)[0]
    for base in ("/backend-api/codex", "/v1"):
        idx = p.find(base + "/")
        if idx != -1 or p.endswith(base):
            cut = idx if idx != -1 else len(p) - len(base)
            return f"{scheme}://{netloc}{p[:cut]}{base}"
    return f"{scheme}://{netloc}"


def _bearer(headers: Mapping[str, str]) -> str | None:
    value = headers.get("authorization") or headers.get("Authorization")
    if value and value.lower().startswith("bearer "):
        return value[7:].strip() or None
    return headers.get("api-key") or headers.get("x-api-key") or None


def _jwt_account(token: str) -> str | None:
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        pad = "=" * (-len(parts[1]) % 4)
        claims = orjson.loads(base64.urlsafe_b64decode(parts[1] + pad))
    except (ValueError, orjson.JSONDecodeError):
        return None
    if not isinstance(claims, dict):
        return None
    auth = claims.get("https://api.openai.com/auth")
    if isinstance(auth, dict) and isinstance(auth.get("chatgpt_account_id"), str):
        return auth["chatgpt_account_id"]
    return claims.get("sub") if isinstance(claims.get("sub"), str) else None


def auth_identity(headers: Mapping[str, str]) -> tuple[str, str | None]:
    """(auth kind, account identity). OAuth accounts are identified by account id, so token refreshes
    keep replay working; API keys by the key plus organisation and project."""
    lower = {k.lower(): v for k, v in headers.items()}
    token = _bearer(lower)
    if not token:
        return "none", None
    account = lower.get("chatgpt-account-id")
    if token.startswith("sk-"):
        org = lower.get("openai-organization", "")
        project = lower.get("openai-project", "")
        return "api_key", f"key\x00{token}\x00{org}\x00{project}"
    if account or token.count(".") == 2:
        ident = account or _jwt_account(token)
        return "oauth", f"account\x00{ident}" if ident else f"token\x00{token}"
    return "bearer", f"token\x00{token}"


@functools.lru_cache(maxsize=256)  # one HMAC per account, not per request
def account_hash(key: bytes, identity: str | None) -> str:
    if not identity:
        return ""
    return hmac.new(key, identity.encode("utf-8"), hashlib.sha256).hexdigest()


def load_key(state_root: Path) -> bytes:
    """The per-installation HMAC key, created on first use."""
    path = state_root / KEY_FILE
    with FileLock(str(state_root / f".{KEY_FILE}.lock"), timeout=10):
        if path.exists():
            data = path.read_bytes()
            if len(data) >= 32:
                return data
        data = secrets.token_bytes(32)
        atomic_write_bytes(path, data, mode=0o600)
        return data


def fingerprint_of(kind: str, model: str, endpoint: str, headers: Mapping[str, str], key: bytes) -> Fingerprint:
    auth_kind, identity = auth_identity(headers)
    return Fingerprint(kind, model, endpoint, auth_kind, account_hash(key, identity))
