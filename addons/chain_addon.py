"""The whole addon chain as one mitmproxy addon (what `ctproxy up` loads; `mitmdump -s addons/all.py` runs it
in a plain mitmdump).

mitmproxy dispatches every event to every addon through a generator, a context manager and a
coroutine, whether the addon has the hook or not: measured, nine empty addons cost 0.64 ms of CPU per
request (bench/bench_proxy.py, section e). The chain addon pays that once and calls its stages directly,
in order, with mitmproxy's semantics kept: a stage that raises is logged and the next stage still runs
(the guard always gets its turn), `AddonHalt` stops the event, and a stage may be sync or return an
awaitable. The event stays synchronous until a stage actually returns an awaitable.

Each stage is still an ordinary addon: every module also loads alone with `mitmdump -s`. The stages
are not registered with mitmproxy one by one (a child addon would be dispatched to again), so code
that looks a stage up by name uses `proxy.host.addonlookup.find_addon`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from mitmproxy import exceptions

from proxy import memory
from proxy.host import flowstate
from proxy.host.addonlookup import CHAIN_ADDON_NAME

log = logging.getLogger("ctproxy.chain")

# Every hook a stage of ours may define; the chain addon forwards exactly these.
HOOKS = ("load", "configure", "running", "done", "requestheaders", "request", "responseheaders", "response",
         "error", "websocket_message", "tcp_message")


def stage_name(stage: Any) -> str:
    """The name mitmproxy would register the stage under (its class name, lower-cased)."""
    return str(getattr(stage, "name", type(stage).__name__)).lower()


def _mitmproxy_hooks() -> set[str]:
    """Every event name mitmproxy dispatches (its hook registry, filled as its modules are imported)."""
    import mitmproxy.http  # registers the HTTP hooks
    import mitmproxy.proxy.layers  # noqa: F401  (registers the connection, TLS, TCP, UDP, DNS hooks)
    from mitmproxy import hooks

    return set(hooks.all_hooks)


def _is_awaitable(value: object) -> bool:
    return value is not None and hasattr(value, "__await__")


class ChainAddon:
    name = CHAIN_ADDON_NAME

    def __init__(self, stages: Sequence[Any]):
        self.stages = tuple(stages)
        for stage in self.stages:
            unforwarded = sorted(h for h in _mitmproxy_hooks() - set(HOOKS) if callable(getattr(stage, h, None)))
            if unforwarded:  # mitmproxy would call these on the stage alone; in the chain they would never run
                raise TypeError(f"stage {stage_name(stage)!r} defines {', '.join(unforwarded)}, which the chain "
                                "addon does not forward: add them to addons/chain_addon.HOOKS")
        self._named = {stage_name(s): s for s in self.stages}
        self._hooks: dict[str, tuple[tuple[Any, Callable[..., Any]], ...]] = {
            hook: tuple((s, fn) for s in self.stages if callable(fn := getattr(s, hook, None))) for hook in HOOKS
        }

    def stage(self, name: str) -> Any | None:
        return self._named.get(name.lower())

    # ---- dispatch ---------------------------------------------------------------------------------

    def _run(self, hook: str, *args: Any) -> Awaitable[None] | None:
        calls = self._hooks[hook]
        for i, (stage, fn) in enumerate(calls):
            result = self._call(stage, hook, fn, args)
            if _is_awaitable(result):
                return self._finish(hook, stage, result, calls[i + 1:], args)
        return None

    async def _finish(self, hook: str, stage: Any, pending: Awaitable[Any],
                      rest: Sequence[tuple[Any, Callable[..., Any]]], args: tuple[Any, ...]) -> None:
        await self._settle(hook, pending, stage)
        for stage, fn in rest:
            result = self._call(stage, hook, fn, args)
            if _is_awaitable(result):
                await self._settle(hook, result, stage)

    @staticmethod
    def _call(stage: Any, hook: str, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        try:
            return fn(*args)
        except (exceptions.AddonHalt, exceptions.OptionsError):
            raise
        except Exception:
            log.exception("addon error in %s.%s", stage_name(stage), hook)
            return None

    @staticmethod
    async def _settle(hook: str, pending: Awaitable[Any], stage: Any) -> None:
        try:
            await pending
        except (exceptions.AddonHalt, exceptions.OptionsError):
            raise
        except Exception:
            log.exception("addon error in %s.%s", stage_name(stage), hook)

    # ---- the hooks mitmproxy calls ----------------------------------------------------------------

    def load(self, loader: Any) -> None:
        for _stage, fn in self._hooks["load"]:
            fn(loader)  # a stage that cannot declare its options must stop the start-up, as it would alone

    def configure(self, updated: set[str]) -> Awaitable[None] | None:
        return self._run("configure", updated)

    def running(self) -> Awaitable[None] | None:
        return self._run("running")

    def done(self) -> Awaitable[None] | None:
        return self._run("done")

    def requestheaders(self, flow: Any) -> Awaitable[None] | None:
        return self._run("requestheaders", flow)

    def request(self, flow: Any) -> Awaitable[None] | None:
        raw = flow.request.raw_content
        if raw is not None and len(raw) >= memory.BIG_BYTES:
            memory.note_big_work(len(raw))  # its memory goes back to the OS once it is gone (proxy/memory.py)
        return self._run("request", flow)

    def responseheaders(self, flow: Any) -> Awaitable[None] | None:
        return self._run("responseheaders", flow)

    def response(self, flow: Any) -> Awaitable[None] | None:
        return _then_release(flow, self._run("response", flow))

    def error(self, flow: Any) -> Awaitable[None] | None:
        return _then_release(flow, self._run("error", flow))

    def websocket_message(self, flow: Any) -> Awaitable[None] | None:
        return self._run("websocket_message", flow)

    def tcp_message(self, flow: Any) -> Awaitable[None] | None:
        return self._run("tcp_message", flow)


def _then_release(flow: Any, pending: Awaitable[None] | None) -> Awaitable[None] | None:
    """After a flow's last hook: its per-flow state is dropped once mitmproxy has sent the answer on (a
    loop turn later, so the freeing is not on the answer's way), or at once without a running loop."""
    if pending is None:
        _release_soon(flow)
        return None

    async def finish() -> None:
        await pending
        _release_soon(flow)

    return finish()


def _release_soon(flow: Any) -> None:
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        flowstate.release(flow)
        return
    loop.call_later(0, flowstate.release, flow)

