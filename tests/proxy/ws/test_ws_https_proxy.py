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
from tests.proxy.ws.test_ws_chain import _tasks, events, turn, user, wait_for

pytestmark = pytest.mark.timeout(180)

SECRET = "Bearer sk-live-SECRET-wss-0123"


def self_signed(tmp: Path, *ips: str) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1, localhost and `ips`, signed by itself (cert.pem, key.pem)."""
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
            .add_extension(x509.SubjectAlternativeName([
                *(x509.IPAddress(ipaddress.ip_address(ip)) for ip in ("127.0.0.1", *ips)),
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


async def test_codex_over_wss_through_ctproxy_as_https_proxy(proxy_factory, tmp_path) -> None:
    """Codex CLI 0.169 in HTTPS proxy mode: `HTTPS_PROXY` at ctproxy, ctproxy's CA trusted through
    `CODEX_CA_CERTIFICATE` (Codex reads it, or `SSL_CERT_FILE`, for a custom CA bundle), its built-in provider's
    `openai_base_url` at the TLS emulator. Codex opens `wss://`, ctproxy intercepts it: every create runs
    through the chain over ctproxy's own socket, no fallback to HTTP. The emulator listens on this machine's
    own (non-loopback) address: Codex sends nothing for a loopback address through its proxy (measured: with
    `https://127.0.0.1:…` Codex went straight to the upstream and ctproxy saw no request)."""
    from tests.e2e.test_ws_codex import ANSWER, config_toml
    from tests.support.codex import codex_env, isolated_dirs, run_codex

    ip = own_address()
    if ip is None:
        pytest.skip("no non-loopback IPv4 address here (Codex never sends a loopback address through its proxy)")
    cert, key = self_signed(tmp_path, ip)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)
    emu = await Emulator(ssl_context=server_ctx).start(host=ip)
    try:
        emu.set_default(Text(ANSWER, deltas=5))
        proxy = await proxy_factory(mode="regular", with_tools=False, env={"SSL_CERT_FILE": str(cert)})
        ca = proxy.state_dir / "mitmproxy" / "mitmproxy-ca-cert.pem"
        home, codex_home, workdir = isolated_dirs(tmp_path)
        (codex_home / "config.toml").write_text(config_toml(f"https://{ip}:{emu.port}/v1"))
        env = codex_env(home, codex_home, CODEX_API_KEY="sk-codex-wss-test-not-real", HTTPS_PROXY=proxy.url,
                        https_proxy=proxy.url, NO_PROXY="", no_proxy="", CODEX_CA_CERTIFICATE=str(ca))
        code, out, err = await run_codex(["exec", "--skip-git-repo-check", "say hi"], workdir, env, 180.0)
        out_s, err_s = out.decode(errors="replace"), err.decode(errors="replace")
        assert code == 0, f"codex exec failed ({code}):\n{err_s[-3000:]}\nproxy log:\n{proxy.log()[-3000:]}"
        assert ANSWER in out_s
        turns = [r for r in emu.requests if r.route == "responses"]
        assert turns and all(r.transport == "ws" and r.status == 200 for r in turns), \
            [(r.method, r.path, r.transport, r.status) for r in turns]
        assert not [r for r in emu.requests if r.method == "POST" and r.path.endswith("/responses")], \
            "Codex fell back to HTTP"
        await wait_for(lambda: proxy.log_path.read_bytes().count(b"ctproxy-request POST") >= len(turns), "log")
        lines = [ln for ln in proxy.log().splitlines() if "ctproxy-request POST" in ln]
        assert len(lines) == len(turns) and all("transport=ws" in ln for ln in lines), \
            (proxy.log()[-3000:], err_s[-2000:])
        # 127.0.0.1 is no official endpoint: Codex's key never reaches it.
        assert not [k for up in emu.ws_upgrades for k, v in up if "sk-codex-wss" in v]
        # The journal holds the session, as with the built-in provider pointed at ctproxy.
        from tests.e2e.test_ws_codex import journaled

        real = [r for r in turns if r.json.get("generate") is not False]
        sessions = await journaled(proxy.state_dir, len(real[-1].json["input"]) + 1)
        assert len(sessions) == 1 and sessions[0]["items"] >= len(real[-1].json["input"]) + 1, sessions
    finally:
        await emu.close()


def own_address() -> str | None:
    """This machine's IPv4 address on its default route (no packet is sent), if it has one."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))
            ip = s.getsockname()[0]
        except OSError:
            return None
    return None if ip.startswith("127.") or ip == "0.0.0.0" else ip


async def test_a_bridged_call_inside_a_wss_turn_through_ctproxy_as_https_proxy(proxy_factory, tmp_path) -> None:
    """HTTPS proxy mode, `--bridge context`: the model's call to the bridged tool runs inside the wss:// turn, its
    next round goes over the same upstream socket, and the client sees one merged lifecycle whose id chains the
    next create on the connection."""
    from tests.emulator import FunctionCall

    cert, key = self_signed(tmp_path)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)
    async with Emulator(ssl_context=server_ctx) as emu, aiohttp.ClientSession() as http:
        proxy = await proxy_factory(mode="regular", extra_args=["--bridge", "context"],
                                    env={"SSL_CERT_FILE": str(cert)})
        client_ctx = ssl.create_default_context(cafile=str(proxy.state_dir / "mitmproxy" / "mitmproxy-ca-cert.pem"))
        emu.script(FunctionCall("get_context_remaining", {}, call_id="call_wss"), Text("bridged over wss"),
                   Text("chained over wss"))
        url = f"wss://127.0.0.1:{emu.port}/v1/responses"
        async with http.ws_connect(url, headers={"OpenAI-Beta": "responses_websockets=2026-02-06"}, proxy=proxy.url,
                                   ssl=client_ctx) as ws:
            first = events(await turn(ws, {"model": "gpt-5", "store": False, "input": user("context left?")}))
            assert first[-1]["type"] == "response.completed", first[-1]
            assert [o["type"] for o in first[-1]["response"]["output"]] == ["mcp_call", "message"]
            assert [e["type"] for e in first].count("response.created") == 1
            second = events(await turn(ws, {"model": "gpt-5", "store": False, "input": user("thanks"),
                                            "previous_response_id": first[-1]["response"]["id"]}))
            assert second[-1]["type"] == "response.completed", second[-1]
        creates = [r for r in emu.requests if r.route == "responses"]
        assert [(r.transport, r.status) for r in creates] == [("ws", 200)] * 3, "no fallback to HTTP"
        assert {r.ws_connection for r in creates} == {1}, "the bridged round went over the same upstream socket"
        outputs = [i for i in creates[1].json["input"] if i.get("type") == "function_call_output"]
        assert outputs and outputs[-1]["call_id"] == "call_wss"


async def _codex_over_wss(proxy_factory, tmp_path, prompt: str, extra_args: list[str], extra_toml: str = ""):
    """One `codex exec` (no sandbox) in HTTPS proxy mode against the TLS emulator on this machine's own address:
    (emulator, proxy, exit code, stdout, stderr). The caller scripts the emulator through `script`."""
    from tests.e2e.test_ws_codex import config_toml
    from tests.support.codex import codex_env, isolated_dirs, run_codex

    ip = own_address()
    if ip is None:
        pytest.skip("no non-loopback IPv4 address here (Codex never sends a loopback address through its proxy)")
    cert, key = self_signed(tmp_path, ip)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)
    emu = await Emulator(ssl_context=server_ctx).start(host=ip)
    proxy = await proxy_factory(mode="regular", extra_args=extra_args, env={"SSL_CERT_FILE": str(cert)})
    ca = proxy.state_dir / "mitmproxy" / "mitmproxy-ca-cert.pem"
    home, codex_home, workdir = isolated_dirs(tmp_path)
    (codex_home / "config.toml").write_text(extra_toml + config_toml(f"https://{ip}:{emu.port}/v1"))
    env = codex_env(home, codex_home, CODEX_API_KEY="sk-codex-wss-test-not-real", HTTPS_PROXY=proxy.url,
                    https_proxy=proxy.url, NO_PROXY="", no_proxy="", CODEX_CA_CERTIFICATE=str(ca))

    async def run() -> tuple[int, str, str]:
        code, out, err = await run_codex(["exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox",
                                          prompt], workdir, env, 180.0)
        return code, out.decode(errors="replace"), err.decode(errors="replace")

    return emu, proxy, run


async def test_codex_gets_a_bridged_call_inside_a_wss_turn_as_https_proxy(proxy_factory, tmp_path) -> None:
    """Codex in HTTPS proxy mode, `--bridge context`: the bridged call runs inside the wss:// turn, its round goes
    over the same upstream socket, and Codex completes its turn; no fallback to HTTP."""
    from tests.e2e.test_ws_codex import ANSWER
    from tests.emulator import FunctionCall

    emu, proxy, run = await _codex_over_wss(proxy_factory, tmp_path, "how much context is left?",
                                            ["--bridge", "context"])
    try:
        emu.script(FunctionCall("get_context_remaining", {}, call_id="call_wss_ctx"))
        emu.set_default(Text(ANSWER, deltas=5))
        code, out, err = await run()
        assert code == 0, f"codex exec failed ({code}):\n{err[-3000:]}\nproxy log:\n{proxy.log()[-3000:]}"
        assert ANSWER in out
        turns = [r for r in emu.requests if r.route in ("responses", "compaction")]
        assert turns and all(r.transport == "ws" and r.status == 200 for r in turns), \
            [(r.transport, r.status, r.extra.get("error_body")) for r in turns]
        assert len({r.ws_connection for r in turns}) == 1, "the bridged round went over the same socket"
        rounds = [r for r in turns if r.json.get("generate") is not False]
        assert len(rounds) == 2
        outputs = [i for i in rounds[1].json["input"] if i.get("type") == "function_call_output"]
        assert outputs and outputs[-1]["call_id"] == "call_wss_ctx"
    finally:
        await emu.close()


async def test_codex_remote_compaction_over_wss_as_https_proxy(proxy_factory, tmp_path) -> None:
    """Codex's own remote compaction (a create ending in `compaction_trigger`, forced by a low
    `model_auto_compact_token_limit`) over the intercepted wss:// socket, through the chain; Codex completes its
    turn on the compacted history."""
    from tests.e2e.test_ws_codex import ANSWER
    from tests.emulator import FunctionCall

    emu, proxy, run = await _codex_over_wss(proxy_factory, tmp_path, "run echo, then answer", [],
                                            "model_auto_compact_token_limit = 1000\n")
    try:
        emu.script(FunctionCall("exec_command", {"cmd": "echo compact-me"}, call_id="call_sh"),
                   Text(ANSWER, deltas=3), Text(ANSWER, deltas=3))
        code, out, err = await run()
        assert code == 0, f"codex exec failed ({code}):\n{err[-3000:]}\nproxy log:\n{proxy.log()[-3000:]}"
        turns = [r for r in emu.requests if r.route in ("responses", "compaction")]
        summary = [(r.route, r.transport, r.status, (r.json.get("input") or [{}])[-1].get("type")) for r in turns]
        assert all(r.transport == "ws" and r.status == 200 for r in turns), summary
        compactions = [r for r in turns if (r.json.get("input") or [{}])[-1].get("type") == "compaction_trigger"]
        assert compactions, summary
        after = turns[turns.index(compactions[0]) + 1:]
        assert any(i.get("type") == "compaction" for r in after for i in r.json.get("input") or []), summary
        assert ANSWER in out
    finally:
        await emu.close()


async def test_codex_new_context_rollover_across_wss_turns_as_https_proxy(proxy_factory, tmp_path) -> None:
    """The rollover of tests/e2e/test_ws_codex.py, with ctproxy as Codex's HTTPS proxy intercepting wss://: the
    bridge's round after `new_context` and Codex's next create (with its shell's output) go up in the new
    window, on the one intercepted socket."""
    from tests.e2e.test_context_codex import assert_new_window
    from tests.e2e.test_ws_codex import ANSWER
    from tests.emulator import FunctionCall

    prompt = "Please do the long task with a rollover in the middle of it."
    emu, proxy, run = await _codex_over_wss(proxy_factory, tmp_path, prompt, ["--bridge", "context,notes"])
    try:
        emu.script(FunctionCall("new_context", {}, call_id="call_nc"),
                   FunctionCall("exec_command", {"cmd": "ls | wc -l"}, call_id="call_sh"), Text(ANSWER, deltas=3))
        code, out, err = await run()
        assert code == 0, f"codex exec failed ({code}):\n{err[-3000:]}\nproxy log:\n{proxy.log()[-3000:]}"
        assert ANSWER in out
        turns = [r for r in emu.requests if r.route in ("responses", "compaction")]
        assert turns and all(r.transport == "ws" and r.status == 200 for r in turns), \
            [(r.transport, r.status, r.extra.get("error_body")) for r in turns]
        assert len({r.ws_connection for r in turns}) == 1, "one intercepted socket, no fallback to HTTP"
        real = [r for r in turns if r.json.get("generate") is not False]
        assert len(real) == 3, [(r.json.get("previous_response_id"), len(r.json.get("input") or [])) for r in real]
        first, round2, nxt = real
        assert "new_context" in {t.get("name") for t in first.json.get("tools") or []}
        assert_new_window(round2.json["input"])
        outputs = [i for i in nxt.json["input"] if i.get("type") == "function_call_output"]
        assert outputs and outputs[-1]["call_id"] == "call_sh"
        assert prompt not in orjson.dumps(nxt.json["input"]).decode(), "Codex's next create is in the new window"
    finally:
        await emu.close()
