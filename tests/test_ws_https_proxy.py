"""The Responses WebSocket in HTTPS proxy mode (issue 28): `ctproxy up --mode regular`, a client that trusts
ctproxy's CA (`<state dir>/mitmproxy/mitmproxy-ca-cert.pem`) opens `wss://…/v1/responses` through it as its
HTTPS proxy. The upstream is the emulator speaking TLS with a self-signed certificate that the proxy process is
told to trust (`SSL_CERT_FILE`: ctproxy's own socket to the upstream verifies it). Each create runs through the
chain (journaled, one request-log line with transport=ws) and goes up over ctproxy's own wss:// socket; the
credentials follow the one credential rule (127.0.0.1 is no official endpoint: they never reach it)."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import ssl
from pathlib import Path

import aiohttp
import orjson
import pytest

from tests.emulator import Emulator, Text
from tests.test_ws_chain import _tasks, events, turn, user, wait_for

pytestmark = pytest.mark.timeout(180)

SECRET = "Bearer sk-live-SECRET-wss-0123"


def self_signed(tmp: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and localhost, signed by itself (cert.pem, key.pem)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ctproxy test upstream")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=7))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                                        x509.DNSName("localhost")]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = tmp / "upstream-cert.pem", tmp / "upstream-key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


async def test_wss_through_ctproxy_as_https_proxy_runs_each_create_through_the_chain(proxy_factory, tmp_path) -> None:
    cert, key = self_signed(tmp_path)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)
    async with Emulator(ssl_context=server_ctx) as emu, aiohttp.ClientSession() as http:
        proxy = await proxy_factory(mode="regular", with_tools=False, env={"SSL_CERT_FILE": str(cert)})
        ca = proxy.state_dir / "mitmproxy" / "mitmproxy-ca-cert.pem"
        client_ctx = ssl.create_default_context(cafile=str(ca))  # the client trusts ctproxy's CA, nothing else
        emu.script(Text("first over wss"), Text("second over wss"))
        url = f"wss://127.0.0.1:{emu.port}/v1/responses"
        headers = {"OpenAI-Beta": "responses_websockets=2026-02-06", "Authorization": SECRET}
        async with http.ws_connect(url, headers=headers, proxy=proxy.url, ssl=client_ctx) as ws:
            first = events(await turn(ws, {"model": "gpt-5", "store": False, "input": user("hello over wss")}))
            assert first[-1]["type"] == "response.completed", first[-1]
            second = events(await turn(ws, {"model": "gpt-5", "store": False, "input": user("again"),
                                            "previous_response_id": first[-1]["response"]["id"]}))
            assert second[-1]["type"] == "response.completed", second[-1]
            assert second[-1]["response"]["output"][0]["content"][0]["text"] == "second over wss"
        creates = [r for r in emu.requests if r.route == "responses"]
        assert [(r.transport, r.status) for r in creates] == [("ws", 200), ("ws", 200)], "no fallback to HTTP"
        assert creates[0].ws_connection == creates[1].ws_connection == 1, "one upstream socket for the connection"
        # The one credential rule: 127.0.0.1 is no official endpoint, so the credentials reach it on no request.
        assert not [(r.path, k) for r in emu.requests for k, v in r.headers if "SECRET" in v]
        assert not [k for up in emu.ws_upgrades for k, v in up if "SECRET" in v]
        assert "x-ctproxy-ws" not in {k.lower() for up in emu.ws_upgrades for k, _ in up}
        # Journaled and logged as WebSocket creates.
        await wait_for(lambda: proxy.log_path.read_bytes().count(b"ctproxy-request POST") >= 2, "log")
        lines = [ln for ln in proxy.log().splitlines() if "ctproxy-request POST" in ln]
        assert len(lines) == 2 and all("transport=ws" in ln and "/v1/responses" in ln for ln in lines), lines
        assert "SECRET" not in proxy.log()
        tasks = orjson.loads(await asyncio.to_thread(_tasks, proxy))
        sessions = [s for t in tasks for a in t["agents"] for s in a["sessions"]]
        assert len(sessions) == 1 and sessions[0]["items"] == 4 and sessions[0]["responses"] == 2, tasks
