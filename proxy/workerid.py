"""Which proxy worker this process is (`ctproxy up --workers N`, docs/adr/0012-proxy-workers.md).

The supervisor starts each worker with `CTPROXY_WORKER=<index>` (1..N) in its environment. Read here, once:
the request log names the worker, and the journal knows that other processes write the same sessions
(it then checks each session's stamp before using what it cached, proxy/journal/journal.py).
"""

from __future__ import annotations

import functools
import os

WORKER_ENV = "CTPROXY_WORKER"


@functools.cache
def index() -> int | None:
    """This worker's index (1..N), or None when the process is not one of several workers."""
    value = os.environ.get(WORKER_ENV, "")
    return int(value) if value.isdigit() and int(value) > 0 else None


def shared_sessions() -> bool:
    """Whether other proxy processes may journal the same sessions at the same time."""
    return index() is not None
