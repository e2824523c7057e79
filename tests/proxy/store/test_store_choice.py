"""Which store `ctproxy up` serves from (proxy/store/choice.py): flag > CTPROXY_STORE > store.url > embedded, and a
URL's password never shown. No database needed: the ones with a real server are
tests/proxy/store/test_store_two_instances.py."""

from __future__ import annotations

import pytest

from proxy.config import Config, ConfigError, set_key
from proxy.store.choice import check_url, public_url, resolve
from proxy.store.postgres import StoreError

URL = "postgresql://alice:pa55word@db.example:5433/ctp?sslmode=require&password=pa55word"


def test_precedence_flag_then_environment_then_config_then_embedded():
    env = {"CTPROXY_STORE": "postgresql://env@h:1/e"}
    assert resolve("postgresql://flag@h:1/f", "postgresql://cfg@h:1/c", env).source == "--store"
    assert resolve(None, "postgresql://cfg@h:1/c", env).url == "postgresql://env@h:1/e"
    assert resolve(None, "postgresql://cfg@h:1/c", {}).source == "store.url"
    default = resolve(None, None, {})
    assert (default.url, default.kind, default.source, default.public) == (None, "embedded", "default", "embedded")
    explicit = resolve("embedded", "postgresql://cfg@h:1/c", env)  # --store embedded beats a configured URL
    assert (explicit.url, explicit.source, explicit.env_value()) == (None, "--store", "embedded")


def test_the_password_is_never_in_the_public_url():
    assert public_url(URL) == "postgresql://alice@db.example:5433/ctp"
    assert "pa55word" not in resolve(URL, None, {}).public
    assert public_url("postgresql://[::1]:5432/db") == "postgresql://[::1]:5432/db"
    assert public_url(None) == public_url("embedded") == "embedded"


def test_unknown_stores_are_refused_with_what_is_accepted():
    with pytest.raises(StoreError, match="use 'embedded' or postgresql://"):
        check_url("mysql://u:secret@h/db")
    with pytest.raises(StoreError) as exc:
        check_url("mysql://u:secret@h/db")
    assert "secret" not in str(exc.value)
    with pytest.raises(StoreError):
        resolve(None, None, {"CTPROXY_STORE": "sqlite:///x"})


def test_config_store_url_is_validated():
    cfg = set_key(Config(), "store.url", "postgresql://u@h:5432/db")
    assert cfg.store.url == "postgresql://u@h:5432/db"
    with pytest.raises(ConfigError, match=r"store\.url"):
        set_key(Config(), "store.url", "http://h/db")
    assert Config().store.url is None


def test_config_show_get_and_set_never_print_the_password(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[3]

    def ctproxy(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "proxy.app.cli", "--state-dir", str(tmp_path / "state"), *args],
                              capture_output=True, text=True, cwd=repo, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout

    said = ctproxy("config", "set", "store.url", URL)
    assert "pa55word" not in said and "postgresql://alice@db.example:5433/ctp" in said
    assert "pa55word" not in ctproxy("config", "show")
    assert "pa55word" not in ctproxy("config", "get", "store.url")
    assert "pa55word" not in ctproxy("config", "get", "store")
    assert "pa55word" in next((tmp_path / "state").rglob("config*.json")).read_text()  # the file keeps it


def test_task_new_on_a_store_that_cannot_be_reached_says_what_to_do(tmp_path):
    import socket
    import subprocess
    import sys
    from pathlib import Path

    with socket.socket() as s:  # a port nothing listens on: bound, never listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "proxy.app.cli", "task", "new", "--state-dir", str(tmp_path),
                               "--store", f"postgresql://u:pa55word@127.0.0.1:{port}/db"],
                              capture_output=True, text=True, cwd=Path(__file__).resolve().parents[3], timeout=120)
    assert done.returncode == 1 and done.stdout == ""
    assert "cannot be reached" in done.stderr and "--store embedded" in done.stderr
    assert "pa55word" not in done.stderr and "Traceback" not in done.stderr
