"""Which store a `ctproxy up` serves from (issue 32, ADR 0013 "Wiring"): `--store URL`, else `CTPROXY_STORE`,
else the config's `store.url`, else the embedded store of the state directory.

The launcher resolves the choice once and hands it to its children (the tool server, each worker of `--workers N`)
in their environment as `CTPROXY_STORE` (never on their command line, which any local user can read); each
process opens its own store (one pool per process) and migrates it. `embedded` names the default explicitly, so
`--store embedded` overrides a configured URL for one run.

A URL's password, if it has one, never appears in a log line, the banner, run.json or `ctproxy status`:
`public_url` drops it (libpq's `PGPASSWORD` or `~/.pgpass` keep it out of the URL altogether).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from proxy.state import StateDir
from proxy.store.embedded import EmbeddedStore
from proxy.store.interface import Store
from proxy.store.postgres import StoreError

ENV = "CTPROXY_STORE"
EMBEDDED = "embedded"
SCHEMES = ("postgresql://", "postgres://")


def check_url(value: str) -> str:
    """`embedded` or a PostgreSQL URL; anything else is a StoreError naming what is accepted."""
    value = value.strip()
    if value == EMBEDDED or value.startswith(SCHEMES):
        return value
    shown = public_url(value) if "://" in value else value
    raise StoreError(f"unknown store {shown!r}: use 'embedded' or postgresql://USER@HOST:PORT/DB")


def public_url(url: str | None) -> str:
    """The store as it may be shown: `embedded`, or the URL without its password (and without query options,
    which may carry one too: `?password=…`)."""
    if not url or url == EMBEDDED:
        return EMBEDDED
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        if ":" in host:
            host = f"[{host}]"
        port = f":{parts.port}" if parts.port else ""
        user = f"{parts.username}@" if parts.username else ""
    except ValueError:
        return "postgresql://(unparsable URL)"
    return urlunsplit((parts.scheme, f"{user}{host}{port}", parts.path, "", ""))


@dataclass(frozen=True)
class StoreChoice:
    url: str | None  # None: the embedded store
    source: str  # "--store", "CTPROXY_STORE", "store.url" or "default"

    @property
    def kind(self) -> str:
        return EMBEDDED if self.url is None else "postgresql"

    @property
    def public(self) -> str:
        return public_url(self.url)

    def env_value(self) -> str:
        """What a child process is given as CTPROXY_STORE: exactly this choice."""
        return self.url or EMBEDDED


def resolve(flag: str | None, config_url: str | None, env: dict[str, str] | None = None) -> StoreChoice:
    """flag > environment > config > embedded (StoreError for a value that is neither)."""
    environ = os.environ if env is None else env
    for value, source in ((flag, "--store"), (environ.get(ENV) or None, ENV), (config_url, "store.url")):
        if value:
            value = check_url(value)
            return StoreChoice(None if value == EMBEDDED else value, source)
    return StoreChoice(None, "default")


def open_store(choice: StoreChoice, state: StateDir, *, timeout: float = 10.0) -> Store:
    """This process's store, its schema brought up to date. A PostgreSQL store that cannot be reached is a
    StoreError that says what to do; nothing is left open."""
    if choice.url is None:
        return EmbeddedStore(state)
    from proxy.store.pg import PostgresStore

    try:
        return PostgresStore.open(choice.url, timeout=timeout)
    except StoreError as exc:
        raise StoreError(f"the store {choice.public} (from {choice.source}) cannot be reached: "
                         f"{_reason(exc, choice.url)}. "
                         "Start the database or fix the URL (--store, CTPROXY_STORE or `ctproxy config set "
                         "store.url`), or run on the embedded store with --store embedded") from None
    except Exception as exc:  # psycopg's own errors (refused, unknown database, authentication)
        raise StoreError(f"the store {choice.public} (from {choice.source}) cannot be reached: "
                         f"{_first_line(exc, choice.url)}. Start the database or fix the URL (--store, "
                         "CTPROXY_STORE or `ctproxy config set store.url`), or run on the embedded store with "
                         "--store embedded") from None


def _reason(exc: BaseException, url: str) -> str:
    text = _first_line(exc, url)
    for prefix in ("the PostgreSQL store cannot be used: ", "cannot connect to PostgreSQL: "):
        if text.startswith(prefix):
            text = text[len(prefix):]
    return text


def _first_line(exc: BaseException, url: str) -> str:
    line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    password = None
    try:
        password = urlsplit(url).password
    except ValueError:
        pass
    if password:
        line = line.replace(password, "***")
    return line.rstrip(".")


def reachable(choice: StoreChoice, timeout: float = 3.0) -> tuple[bool, str]:
    """For `ctproxy status`: whether the store answers now (the embedded store always does), and if not why."""
    if choice.url is None:
        return True, "the state directory's database"
    try:
        from proxy.store import postgres

        psycopg = postgres.driver()
        with psycopg.connect(choice.url, connect_timeout=max(1, int(timeout))) as conn:
            conn.execute("SELECT 1").fetchone()
    except Exception as exc:
        return False, _first_line(exc, choice.url)
    return True, "answers"
