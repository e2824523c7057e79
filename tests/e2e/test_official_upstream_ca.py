"""`ctproxy up --upstream-ca FILE` (config `upstream.ca_file`, issue 43): a missing, unreadable or empty file is a
clear start-up error (nothing is started); a good one is named by `ctproxy status`, and the trust it adds is
exercised end to end in tests/e2e/test_official_route.py."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from proxy.upstream import trust
from tests.support.official import make_ca, official  # noqa: F401  (the fixture)
from tests.support.proxyproc import REPO


def _up(tmp_path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "proxy.app.cli", "up", "--state-dir", str(tmp_path / "s"),
                           "--listen", "127.0.0.1:0", "--tools-listen", "127.0.0.1:0", "--no-tools", *args],
                          capture_output=True, text=True, cwd=REPO, timeout=120)


@pytest.mark.parametrize("content", [None, b"", b"not a certificate\n",
                                     b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"])
def test_a_bad_ca_file_stops_up_with_a_clear_error(tmp_path, content):
    path = tmp_path / "ca.pem"
    if content is not None:
        path.write_bytes(content)
    out = _up(tmp_path, "--upstream-ca", str(path))
    assert out.returncode != 0
    assert "--upstream-ca / upstream.ca_file" in out.stderr and str(path) in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
    assert "ctproxy ready" not in out.stdout


def test_the_config_key_is_checked_the_same_way(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"upstream": {"ca_file": str(tmp_path / "missing.pem")}}))
    out = _up(tmp_path, "--config", str(tmp_path / "config.json"))
    assert out.returncode != 0 and "cannot read" in out.stderr and "missing.pem" in out.stderr, out.stderr


def test_trust_adds_the_file_to_the_system_store(tmp_path):
    ca, _, _ = make_ca(tmp_path)
    try:
        assert trust.client_ssl() is True  # nothing configured: aiohttp's default (the system store)
        trust.configure(ca)
        ctx = trust.client_ssl()
        names = {dict(x[0] for x in c["subject"]).get("commonName") for c in ctx.get_ca_certs()}
        assert "ctproxy test CA (throw-away)" in names and len(names) > 1, "the system store still applies"
        bundle = trust.mitm_bundle(tmp_path).read_bytes()
        assert ca.read_bytes().strip() in bundle and bundle.count(b"BEGIN CERTIFICATE") > 10
    finally:
        trust.configure(None)


async def test_status_names_the_file(official):  # noqa: F811
    proxy = await official.proxy()
    out = subprocess.run(official.command([sys.executable, "-m", "proxy.app.cli", "status", "--state-dir",
                                           str(proxy.state_dir)]), capture_output=True, text=True, timeout=120)
    assert f"upstream CA: {official.ca_pem}" in out.stdout, out.stdout + out.stderr
