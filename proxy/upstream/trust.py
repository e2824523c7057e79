"""Extra certificate authorities for ctproxy's upstream TLS: `ctproxy up --upstream-ca FILE` (config
`upstream.ca_file`), for a TLS-inspecting corporate proxy or a gateway with a private certificate.

The file (PEM, one or more certificates) ADDS trust: the system's store still applies and verification stays
on. One process-wide setting, made once at start-up (`configure`) by the proxy, each worker and the tool server;
read by every client ctproxy opens itself (`client_ssl`: proxy/upstream/transport.py, the WebSocket leg in
proxy/upstream/ws.py) and turned into a bundle for mitmproxy's own upstream connections (`mitm_bundle`:
mitmproxy's `ssl_verify_upstream_trusted_ca` replaces its default store, certifi, so the bundle holds certifi,
the system's file and the extra certificates).
"""

from __future__ import annotations

import ssl
from pathlib import Path

from proxy.errors import CtproxyError

_BEGIN = b"-----BEGIN CERTIFICATE-----"
_configured: Path | None = None
_context: ssl.SSLContext | None = None


class TrustError(CtproxyError, ValueError):
    """The extra CA file is missing, unreadable or holds no certificate; worded for the user."""


def check(path: str | Path) -> Path:
    """The file as an absolute path once it is readable PEM with at least one certificate OpenSSL loads."""
    p = Path(path).expanduser().resolve()
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise TrustError(f"--upstream-ca / upstream.ca_file: cannot read {p}: {exc.strerror or exc}") from None
    if _BEGIN not in data:
        raise TrustError(f"--upstream-ca / upstream.ca_file: {p} holds no PEM certificate "
                         "(expected one or more '-----BEGIN CERTIFICATE-----' blocks)")
    try:
        ssl.create_default_context().load_verify_locations(cafile=str(p))
    except ssl.SSLError as exc:
        raise TrustError(f"--upstream-ca / upstream.ca_file: {p} is not a usable certificate file: {exc}") from None
    return p


def configure(ca_file: str | Path | None) -> Path | None:
    """Set this process's extra CA file (None: the system store only). Raises TrustError for a bad file."""
    global _configured, _context
    _configured = check(ca_file) if ca_file else None
    _context = None
    return _configured


def configured() -> Path | None:
    return _configured


def client_ssl() -> ssl.SSLContext | bool:
    """What aiohttp is given as `ssl=` for an upstream call: True (its default, the system store) without an
    extra CA; else one context with the system store and the extra certificates, verification on."""
    global _context
    if _configured is None:
        return True
    if _context is None:
        ctx = ssl.create_default_context()  # the system store, hostname checks, CERT_REQUIRED
        ctx.load_verify_locations(cafile=str(_configured))
        _context = ctx
    return _context


def mitm_bundle(directory: Path) -> Path | None:
    """A PEM file for mitmproxy's `ssl_verify_upstream_trusted_ca`: certifi's store (mitmproxy's default), the
    system's CA file and the extra certificates. None without an extra CA (mitmproxy keeps its default)."""
    if _configured is None:
        return None
    import certifi

    parts = [Path(certifi.where()).read_bytes()]
    system = ssl.get_default_verify_paths().cafile
    if system and Path(system).is_file():
        parts.append(Path(system).read_bytes())
    parts.append(_configured.read_bytes())
    out = directory / "upstream-ca-bundle.pem"
    out.write_bytes(b"\n".join(p.rstrip(b"\n") for p in parts) + b"\n")
    return out
