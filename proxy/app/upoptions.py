"""What `ctproxy up` was asked for: the options of one run, shared by the launcher and the workers'
supervisor (proxy/app/workers.py), which the launcher starts: its own module, so neither imports the other back."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class UpOptions:
    listen_host: str = "127.0.0.1"
    listen_port: int = 8787
    mode: str = "reverse"  # reverse | regular
    upstream: str | None = None
    trust_upstream: bool = False
    tools_host: str = "127.0.0.1"
    tools_port: int = 8788
    with_tools: bool = True
    state_dir: Path | None = None
    config_file: Path | None = None
    workspace: Path | None = None  # file and shell tools refuse without one (no surprising default)
    record: Path | None = None
    server_replay: Path | None = None
    enable: list[str] = field(default_factory=list)
    disable: list[str] = field(default_factory=list)
    debug: bool = False
    bridge: list[str] | None = None  # --bridge: bridge.families for this run (None: as configured)
    sandbox: str | None = None  # --sandbox: shell.sandbox for this run (None: as configured)
    quiet: bool = False  # no request log line (issue 17)
    metrics: bool = True  # Prometheus metrics and the dashboard's request feed (proxy/app/telemetry.py)
    upstream_ca: str | None = None  # --upstream-ca FILE: upstream.ca_file for this run (absolute path)
    workers: int | str | None = None  # --workers N|auto: config proxy.workers for this run (None: as configured)
    # --store URL|embedded (None: CTPROXY_STORE, else store.url, else embedded). Never handed to a child on its
    # command line: the launcher gives children the resolved choice as CTPROXY_STORE (proxy/store/choice.py).
    store: str | None = None
