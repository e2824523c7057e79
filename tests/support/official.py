"""The official-route double (issue 43): ctproxy on its DEFAULT upstream (https://api.openai.com/v1 and
https://chatgpt.com/backend-api/codex), tested end to end without leaving the machine.

How it works (the `official` fixture; any test may take it):
- A holder process made by the test itself, `unshare --net --mount`, owns a private network namespace with
  loopback only (`ip link set lo up`) and a private mount namespace where `/etc/hosts` is bind-mounted to a file
  naming `api.openai.com` and `chatgpt.com` as 127.0.0.1.
- Before anything is started the fixture checks, from inside: loopback is the only interface, no route leads
  anywhere but `lo` (`ip route get` to an outside address fails), and both official names resolve to
  127.0.0.1 from the bind-mounted file. Any failure there is a test error, never a fallback.
- The TEST THREAD joins the network namespace (`setns`, per thread on Linux; undone at teardown): the emulator
  the fixture starts and every socket the test opens are inside. The emulator serves TLS on 127.0.0.1:443 with a
  certificate for both official names from a throw-away CA (`ca_pem`).
- Processes are started inside both namespaces with `nsenter` (`official.command(argv)`, `official.proxy(...)`
  for `ctproxy up` on its default upstream with `--upstream-ca` at the CA; `upstream_ca=False` leaves it out).
  A child started any other way would be in the machine's network: always go through `command`.
- Not root, or no `unshare`/`nsenter`/`ip`, or a namespace the kernel refuses: the test skips with that reason.
  No step ever resolves the real hosts: the test process itself never looks a name up.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import shutil
import socket
import ssl
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import aiohttp.abc
import pytest

from tests.emulator import Emulator
from tests.support.proxyproc import REPO, ProxyProcess

OFFICIAL_NAMES = ("api.openai.com", "chatgpt.com")
OUTSIDE_PROBES = ("1.1.1.1", "2606:4700:4700::1111")  # `ip route get` only: the kernel's answer, no packet sent
TOOLS = ("unshare", "nsenter", "ip", "getent", "env")
DROPPED_ENV = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "all_proxy",
               "no_proxy", "OPENAI_BASE_URL", "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE")


def unavailable() -> str | None:
    """Why the double cannot run here (None: it can)."""
    if not hasattr(os, "setns"):
        return "os.setns needs Python 3.12+ on Linux"
    if os.geteuid() != 0:
        return "the official-route double makes a network namespace: needs root"
    missing = [t for t in TOOLS if shutil.which(t) is None]
    return f"the official-route double needs {', '.join(missing)}" if missing else None


def make_ca(tmp: Path) -> tuple[Path, Path, Path]:
    """A throw-away CA and a server certificate it signs for the official names: (ca.pem, cert.pem, key.pem)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ctproxy test CA (throw-away)")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
          .not_valid_after(now + datetime.timedelta(days=2))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, OFFICIAL_NAMES[0])]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in OFFICIAL_NAMES]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    paths = tmp / "test-ca.pem", tmp / "official-cert.pem", tmp / "official-key.pem"
    paths[0].write_bytes(ca.public_bytes(pem))
    paths[1].write_bytes(cert.public_bytes(pem) + ca.public_bytes(pem))
    paths[2].write_bytes(key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return paths


class NamespacedProxy(ProxyProcess):
    """`ctproxy up` started inside the double's namespaces."""

    def __init__(self, net: OfficialNet, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.net = net

    def args(self) -> list[str]:
        return self.net.command(super().args())


@dataclass
class OfficialNet:
    holder: subprocess.Popen[bytes]
    tmp: Path
    ca_pem: Path
    emulator: Emulator
    procs: list[ProxyProcess] = field(default_factory=list)

    def command(self, argv: list[str], cwd: Path | str = REPO, set_env: dict[str, str] | None = None) -> list[str]:
        """`argv` run in `cwd` inside the double's network and mount namespaces, without the machine's proxy and
        CA variables (trust comes from `--upstream-ca` alone), then with `set_env` (a client's HTTPS_PROXY at
        ctproxy, say). The directory is entered inside the mount namespace (`cd` there): nsenter's `--wd` leaves
        a working directory of the old one, which Codex refuses ("(unreachable)/…")."""
        pid = self.holder.pid
        unset = [a for v in DROPPED_ENV for a in ("-u", v)]
        assign = [f"{k}={v}" for k, v in (set_env or {}).items()]
        return ["nsenter", f"--net=/proc/{pid}/ns/net", f"--mount=/proc/{pid}/ns/mnt", "--",
                "sh", "-c", 'cd "$1" && shift && exec "$@"', "sh", str(cwd), "env", *unset, *assign, *argv]

    def env(self, **extra: str) -> dict[str, str]:
        """An environment for a child without the machine's proxy and CA variables, plus `extra`."""
        drop = {v.lower() for v in DROPPED_ENV}
        return {**{k: v for k, v in os.environ.items() if k.lower() not in drop}, **extra}

    async def proxy(self, *, upstream_ca: bool = True, mode: str = "reverse", extra_args: list[str] | None = None,
                    with_tools: bool = True, env: dict[str, str] | None = None) -> ProxyProcess:
        """`ctproxy up` on its default upstream, inside the namespaces, `--upstream-ca` at the test CA."""
        args = [*(["--upstream-ca", str(self.ca_pem)] if upstream_ca else []), *(extra_args or [])]
        state = self.tmp / f"state{len(self.procs)}"
        proc = NamespacedProxy(self, state, upstream=None, trust_upstream=False, mode=mode, extra_args=args,
                               with_tools=with_tools, env=env)
        self.procs.append(proc)
        return await proc.astart()


def _inside(holder: subprocess.Popen[bytes], *argv: str) -> subprocess.CompletedProcess[str]:
    pid = holder.pid
    return subprocess.run(["nsenter", f"--net=/proc/{pid}/ns/net", f"--mount=/proc/{pid}/ns/mnt", "--", *argv],
                          capture_output=True, text=True, timeout=30)


def check_isolated(holder: subprocess.Popen[bytes]) -> None:
    """Loopback the only interface, no route off `lo`, the official names at 127.0.0.1: else the test errors."""
    links = json.loads(_inside(holder, "ip", "-j", "link", "show").stdout or "[]")
    names = sorted(link["ifname"] for link in links)
    if names != ["lo"]:
        raise AssertionError(f"the namespace has interfaces other than loopback: {names}")
    for family in ("-4", "-6"):
        out = _inside(holder, "ip", "-j", family, "route", "show", "table", "all")
        routes = json.loads(out.stdout or "[]")
        off_lo = [r for r in routes if r.get("dev") != "lo"]
        if off_lo:
            raise AssertionError(f"the namespace has routes off loopback: {off_lo}")
    for probe in OUTSIDE_PROBES:
        if _inside(holder, "ip", "route", "get", probe).returncode == 0:
            raise AssertionError(f"the namespace has a route to {probe}")
    for name in OFFICIAL_NAMES:
        got = {line.split()[0] for line in _inside(holder, "getent", "ahosts", name).stdout.splitlines() if line}
        if got != {"127.0.0.1"}:
            raise AssertionError(f"{name} does not resolve to 127.0.0.1 only inside the namespace: {got}")


def _start_holder(tmp: Path) -> subprocess.Popen[bytes]:
    hosts = tmp / "hosts"
    hosts.write_text("127.0.0.1 localhost " + " ".join(OFFICIAL_NAMES) + "\n::1 localhost ip6-localhost\n")
    script = f"ip link set lo up && mount --bind {hosts} /etc/hosts && echo ready && exec sleep 86400"
    holder = subprocess.Popen(["unshare", "--net", "--mount", "--propagation", "private", "--", "sh", "-c", script],
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    line = holder.stdout.readline() if holder.stdout is not None else b""
    if line.strip() != b"ready":
        holder.kill()
        err = holder.stderr.read().decode(errors="replace") if holder.stderr is not None else ""
        holder.wait()
        pytest.skip(f"no private network namespace here (unshare: {err.strip() or 'no output'})")
    return holder


def _thread_in_namespace() -> None:
    names = sorted(n for _, n in socket.if_nameindex())
    if names != ["lo"]:
        raise AssertionError(f"the test thread is not in the private namespace (interfaces {names})")


@pytest.fixture
async def official(tmp_path: Path) -> AsyncIterator[OfficialNet]:
    """The official-route double (see the module): `official.emulator` on api.openai.com:443 and
    chatgpt.com:443 inside a private network, `await official.proxy()` for ctproxy on its default upstream."""
    if (why := unavailable()) is not None:
        pytest.skip(why)
    holder = _start_holder(tmp_path)
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    theirs = os.open(f"/proc/{holder.pid}/ns/net", os.O_RDONLY)
    emu: Emulator | None = None
    net: OfficialNet | None = None
    joined = False
    try:
        check_isolated(holder)
        os.setns(theirs, os.CLONE_NEWNET)
        joined = True
        _thread_in_namespace()
        ca, cert, key = make_ca(tmp_path)
        server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server_ctx.load_cert_chain(cert, key)
        emu = await Emulator(ssl_context=server_ctx).start(host="127.0.0.1", port=443)
        net = OfficialNet(holder, tmp_path, ca, emu)
        yield net
    finally:
        if net is not None:
            for p in net.procs:
                await p.astop()
        if emu is not None:
            await emu.close()
        if joined:
            os.setns(own, os.CLONE_NEWNET)
        os.close(own)
        os.close(theirs)
        holder.kill()
        holder.wait()
        await asyncio.sleep(0)


class _NumericOnly(aiohttp.abc.AbstractResolver):
    """A resolver that looks no name up: a test client inside the double connects to addresses only (a proxied
    request names its target to the proxy, which resolves it inside the namespace)."""

    async def resolve(self, host: str, port: int = 0, family: int = socket.AF_INET) -> list[dict[str, Any]]:
        import ipaddress

        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            raise OSError(f"the official-route double never resolves names in the test process ({host})") from None
        fam = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
        return [{"hostname": host, "host": host, "port": port, "family": fam, "proto": 0,
                 "flags": socket.AI_NUMERICHOST}]

    async def close(self) -> None:
        return None


def loopback_connector() -> aiohttp.TCPConnector:
    """An aiohttp connector for the test's own calls: one connection per request (the kernel picks a worker
    per connection), and no name resolution at all (`_NumericOnly`)."""
    return aiohttp.TCPConnector(force_close=True, resolver=_NumericOnly())


def client_ssl(ca: Path) -> ssl.SSLContext:
    """A client context that trusts only `ca` (for a test that talks TLS to the double directly)."""
    return ssl.create_default_context(cafile=str(ca))
