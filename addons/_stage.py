"""What every stage shares: its options, and the process runtime kept on `self`.

A stage takes the runtime (config, state directory, upstream, the typed `Services`) in `configure()`,
the way mitmproxy's own addons keep their configuration on `self`, and its hooks read `self.rt`. It is
taken again when a `ctp_*` option changes (mitmproxy calls `configure` with the changed names) and when
the launcher or a test installs a runtime explicitly (`proxy.app.runtime.install` unbinds every stage). A
hook that runs before any `configure` (a unit test calling a stage directly) binds on first use.

Binding also pushes the settings that code below the stages reads on every request (the body limit in
`proxy.host.flowbody`, the upstream timers in `proxy.host.httpstream`), so that code never looks the runtime up.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable
from typing import Any

from proxy.app import runtime
from proxy.host import flowbody, httpstream, mitm_typecheck


class Stage:
    _rt: runtime.Runtime | None = None

    def load(self, loader: Any) -> None:
        runtime.declare_options(loader)
        mitm_typecheck.install()  # flows freed when they end, not by the cyclic collector (see the module)

    def configure(self, updated: set[str]) -> None:
        if self._rt is None or not updated.isdisjoint(runtime.OPTION_NAMES):
            runtime.invalidate(updated)
            self._bind()

    @property
    def rt(self) -> runtime.Runtime:
        rt = self._rt
        return rt if rt is not None else self._bind()

    def _bind(self) -> runtime.Runtime:
        rt = runtime.current()
        runtime.bind(self)
        self._rt = rt
        flowbody.set_max_body_bytes(rt.config.limits.max_body_bytes)
        t = rt.config.timeouts
        httpstream.set_timeouts(t.connect_seconds, t.stream_idle_seconds)
        self.bound(rt)
        return rt

    def unbind(self) -> None:
        """The runtime was replaced (`runtime.install`/`uninstall`): take the new one on next use."""
        self._rt = None

    def bound(self, rt: runtime.Runtime) -> None:
        """Called after each (re)binding: a stage that caches something derived from the runtime resets it."""


_closing: set[asyncio.Task[Any]] = set()  # closes in flight, kept until done (the loop holds tasks weakly)


def close_later(closing: Awaitable[Any] | None) -> None:
    """Finish a dropped object's close (its connections, its shared database thread) without blocking `bound()`.

    On the running loop it becomes a task; with no loop (a unit test rebinding outside one) nothing was opened
    on a loop either, so the coroutine is closed unawaited rather than left to warn."""
    if closing is None:
        return
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        if inspect.iscoroutine(closing):
            closing.close()
        return
    task = loop.create_task(_quietly(closing))
    _closing.add(task)
    task.add_done_callback(_closing.discard)


async def _quietly(closing: Awaitable[Any]) -> None:
    try:
        await closing
    except Exception:  # a close that fails leaves nothing to recover; the new object is already in use
        import logging

        logging.getLogger("ctproxy").debug("stage: closing a dropped object failed", exc_info=True)
