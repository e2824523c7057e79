"""`ctproxy context checkpoint` is refused, with the reason, when the proxy that would serve it cannot:
the running proxy's configuration (run.json's snapshot) wins over the file's."""
from __future__ import annotations

import json
import os
from pathlib import Path

from proxy.app.cli import main as cli_main
from proxy.config import Config, save_config
from proxy.db import connect
from proxy.journal import Journal
from proxy.session import SessionIdentity
from proxy.state import StateDir
from proxy.windows.notes import rollover


def _state_with_an_agent(root: Path) -> tuple[StateDir, str]:
    state = StateDir.open(root / "state")
    journal = Journal(state)
    key, task, addr = journal.resolve(SessionIdentity("f:a", "fingerprint", None, None), {}, {})
    journal.ingest_request(journal.session(key, task, addr), {"input": [{"role": "user", "content": "hi"}]})
    assert journal.flush()
    journal.close()
    return state, task


def _pending(state: StateDir) -> set[tuple[str, str]]:
    conn = connect(state.db_path)
    try:
        rollover.ensure(conn)
        return {tuple(r) for r in conn.execute("SELECT address, kind FROM context_rollovers")}
    finally:
        conn.close()


def test_the_files_config_refuses_when_no_proxy_runs(tmp_path: Path, capsys) -> None:
    state, task = _state_with_an_agent(tmp_path)
    cfg = Config()
    cfg.context.enabled = False
    save_config(cfg, state.root / "config.json")
    args = ["context", "checkpoint", "--task", task, "--agent", "/root", "--state-dir", str(state.root),
            "--config", str(state.root / "config.json")]
    assert cli_main(args) == 1
    assert "context is off" in capsys.readouterr().err and _pending(state) == set()


def test_the_running_proxys_config_wins_over_the_file(tmp_path: Path, capsys) -> None:
    state, task = _state_with_an_agent(tmp_path)
    save_config(Config(), state.root / "config.json")  # the file would serve it...
    running = Config()
    running.notes.enabled = False  # ...the running proxy (notes strategy, notes off) cannot
    run = {"pid": os.getpid(), "config": json.loads(running.model_dump_json())}
    (state.root / "run.json").write_text(json.dumps(run))
    args = ["context", "checkpoint", "--task", task, "--agent", "/root", "--state-dir", str(state.root),
            "--config", str(state.root / "config.json")]
    assert cli_main(args) == 1
    assert "notes are off" in capsys.readouterr().err and _pending(state) == set()

    (state.root / "run.json").unlink()  # no proxy: the file's config serves it
    assert cli_main(args) == 0
    assert "checkpoint pending for /root" in capsys.readouterr().out
    assert _pending(state) == {("/root", "checkpoint")}
