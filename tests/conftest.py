"""Fixtures shared by the whole suite."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from proxy.app import runtime
from proxy.journal import close_all
from tests.emulator import Emulator
from tests.openapi_schema import spec_available
from tests.support import sandbox as sandbox_support
from tests.support.proxyproc import ProxyProcess
from tests.support.toolserver import ToolServerHandle, make_services

if sandbox_support.MISSING:  # no bubblewrap here: shell tests other than the sandbox's own run unsandboxed
    sandbox_support.use_fallback_default()


@pytest.fixture
async def tool_server(tmp_path: Path) -> AsyncIterator[Callable[..., Any]]:
    """Factory: `srv = await tool_server({"shell.enabled": True}, workspace=path)` starts the tool server
    app on a loopback port; `srv.rest(name, args, task=, agent=)`, `srv.mcp(name, args, ...)` call it."""
    handles: list[ToolServerHandle] = []

    async def start(overrides: dict[str, Any] | None = None, workspace: Path | None = None) -> ToolServerHandle:
        services = make_services(tmp_path / f"ts{len(handles)}", overrides, workspace)
        handle = ToolServerHandle(services, services.state.token())
        await handle.start()
        handles.append(handle)
        return handle

    yield start
    for h in handles:
        await h.close()


@pytest.fixture
def rt(tmp_path: Path) -> Iterator[runtime.Runtime]:
    """The addon runtime installed for in-process chain tests, on a fresh state directory; the journal
    is flushed and closed afterwards."""
    built = runtime.build(state_dir=str(tmp_path / "state"))
    runtime.install(built)
    yield built
    if built.services.journal is not None:
        built.services.journal.flush()
    close_all()
    runtime.uninstall()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "validate_requests(always=False): the `emulator` answers 400 to a request that "
                            "violates the official OpenAPI description (where the description is here; always: even "
                            "where it is not, which then fails the test)")


@pytest.fixture
async def emulator(request: pytest.FixtureRequest) -> AsyncIterator[Emulator]:
    """A Responses upstream emulator on loopback (see tests/emulator); with the `validate_requests` mark, it also
    validates every request against the official OpenAPI description (issue 31). One fixture for every test."""
    mark = request.node.get_closest_marker("validate_requests")
    validate = bool(mark and (mark.kwargs.get("always") or spec_available()))
    async with Emulator(validate_requests=validate) as emu:
        yield emu


@pytest.fixture
async def proxy_factory(tmp_path: Path) -> AsyncIterator[Callable[..., Any]]:
    """Factory: `proxy = await proxy_factory(upstream=emu.url, extra_args=[...])` runs `ctproxy up` as a
    real process on free ports (trusting the upstream by default) and stops it after the test."""
    procs: list[ProxyProcess] = []

    async def start(**kwargs: Any) -> ProxyProcess:
        state_dir = kwargs.pop("state_dir", None) or tmp_path / f"state{len(procs)}"
        proc = ProxyProcess(state_dir, **kwargs)
        procs.append(proc)
        return await proc.astart()

    yield start
    for p in procs:
        await p.astop()


@pytest.fixture
async def proxy(emulator: Emulator, proxy_factory: Callable[..., Any]) -> ProxyProcess:
    """`ctproxy up --upstream <emulator> --trust-upstream` with default features."""
    return await proxy_factory(upstream=emulator.url)
