"""A private PostgreSQL server for the tests of the shared store (issue 32), from Debian's `postgresql` package.

The server binaries are in /usr/lib/postgresql/<version>/bin (not on PATH). initdb and pg_ctl refuse to run as
root, so as root they run as the `postgres` user (`runuser`) on a data directory it owns, in a folder it can
reach. The server listens on 127.0.0.1 only (no Unix socket), with fsync off; a login role `ctproxy` that is not
a superuser owns the database `ctproxy` (so ctproxy creates its own tables, and `pg_trgm`, a trusted extension).
Where PostgreSQL or psycopg cannot be had, the test skips with the reason the set-up recorded.

The port: the server binds it itself, so a free one is picked and, if another process takes it first, start-up
fails and the next one is tried (a bounded number of times).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.optional import setup_skipped

ROLE = "ctproxy"
DATABASE = "ctproxy"


def server_bin() -> Path | None:
    """The newest installed server's bin directory, or None."""
    found = []
    for d in Path("/usr/lib/postgresql").glob("*/bin"):
        if (d / "initdb").exists() and (d / "pg_ctl").exists() and re.fullmatch(r"\d+", d.parent.name):
            found.append((int(d.parent.name), d))
    return max(found)[1] if found else None


def unavailable() -> str | None:
    """Why a private server cannot be started here, or None."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg is not installed; run scripts/bootstrap.sh (make test does)"
    if server_bin() is None:
        said = setup_skipped("postgresql")
        return (f"PostgreSQL is not installed: the set-up skipped {said}" if said else
                "PostgreSQL is not installed (Debian: apt-get install postgresql; scripts/bootstrap.sh does)")
    if os.geteuid() == 0 and (shutil.which("runuser") is None or not _user_exists("postgres")):
        return "running as root, and there is no `postgres` user or no runuser to start the server as"
    return None


def _user_exists(name: str) -> bool:
    import pwd

    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class PrivateServer:
    root: Path
    port: int = 0

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def url(self) -> str:
        return f"postgresql://{ROLE}@127.0.0.1:{self.port}/{DATABASE}"

    @property
    def admin_url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        cmd = list(args)
        if os.geteuid() == 0:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=self.root)

    def start(self) -> PrivateServer:
        bin_dir = server_bin()
        assert bin_dir is not None
        self.root.chmod(0o755)  # the postgres user reaches the data directory through it
        self.data.mkdir(mode=0o700)
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres")
            shutil.chown(self.data, "postgres")
        out = self._run(str(bin_dir / "initdb"), "-D", str(self.data), "-A", "trust", "-E", "UTF8", "--locale=C",
                        "--no-sync", "-U", "postgres")
        if out.returncode != 0:
            raise RuntimeError(f"initdb failed: {out.stderr.strip()[-500:]}")
        for _ in range(5):
            self.port = _free_port()
            with (self.data / "postgresql.auto.conf").open("a") as conf:
                conf.write(f"listen_addresses = '127.0.0.1'\nport = {self.port}\nunix_socket_directories = ''\n"
                           "fsync = off\nfull_page_writes = off\nsynchronous_commit = off\n")
            out = self._run(str(bin_dir / "pg_ctl"), "-D", str(self.data), "-l", str(self.root / "server.log"),
                            "-w", "-t", "60", "start")
            if out.returncode == 0:
                break
            log = (self.root / "server.log").read_text(errors="replace") if (self.root / "server.log").exists() else ""
            if "could not bind" not in log and "Address already in use" not in log:
                raise RuntimeError(f"pg_ctl start failed: {out.stderr.strip()[-300:]} {log[-500:]}")
        else:
            raise RuntimeError("PostgreSQL found no free port in 5 attempts")
        import psycopg

        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f"CREATE ROLE {ROLE} LOGIN")
            conn.execute(f"CREATE DATABASE {DATABASE} OWNER {ROLE}")
        return self

    def stop(self) -> None:
        bin_dir = server_bin()
        if bin_dir is not None and (self.data / "postmaster.pid").exists():
            self._run(str(bin_dir / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop", timeout=60)
        shutil.rmtree(self.root, ignore_errors=True)

    def fresh_database(self, name: str) -> str:
        """Another empty database owned by the ctproxy role (one per test), its URL."""
        import psycopg

        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name} OWNER {ROLE}")
        return f"postgresql://{ROLE}@127.0.0.1:{self.port}/{name}"


def private_server() -> Iterator[PrivateServer]:
    """A running private server (a generator for a pytest fixture); skips where none can be had."""
    why = unavailable()
    if why is not None:
        pytest.skip(why)
    # Not under pytest's tmp_path: its parents are private to root, and the postgres user must reach the data.
    server = PrivateServer(Path(tempfile.mkdtemp(prefix="ctproxy-pg-")))
    try:
        yield server.start()
    finally:
        server.stop()
