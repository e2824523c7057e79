"""One error tree (issue 30): every exception class ctproxy defines descends from `CtproxyError`, and the
failures of what ctproxy depends on (an upstream, its tool server, a compaction call) from `UpstreamError`.
Found by reading the source (every class in proxy/, addons/ and tools_server/), so a new class that forgets
the base fails here."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

from proxy.errors import CtproxyError, UpstreamError

REPO = Path(__file__).resolve().parents[2]
ROOMS = ("proxy", "addons", "tools_server")


def _exception_classes() -> list[type[BaseException]]:
    found = []
    for room in ROOMS:
        for path in sorted((REPO / room).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            names = [n.name for n in tree.body if isinstance(n, ast.ClassDef) and n.bases]
            if not names:
                continue
            try:
                module = importlib.import_module(".".join(path.relative_to(REPO).with_suffix("").parts))
            except ImportError:  # an optional platform library (a macOS or X11 backend) is missing here
                continue
            for name in names:
                cls = getattr(module, name, None)
                if isinstance(cls, type) and issubclass(cls, BaseException) and cls.__module__ == module.__name__:
                    found.append(cls)
    return found


def test_every_ctproxy_exception_is_a_ctproxy_error() -> None:
    classes = _exception_classes()
    assert len(classes) >= 35
    strays = [f"{c.__module__}.{c.__qualname__}" for c in classes if not issubclass(c, CtproxyError)]
    assert strays == []


def test_the_upstream_failures_are_upstream_errors() -> None:
    from proxy.toolclient import ToolServerUnreachable
    from proxy.upstream.transport import UpstreamBroken, UpstreamUnavailable
    from proxy.windows.remote.protocol import CompactionFailure

    for cls in (UpstreamUnavailable, UpstreamBroken, ToolServerUnreachable, CompactionFailure):
        assert issubclass(cls, UpstreamError) and issubclass(cls, CtproxyError)
    from proxy.items.addresses import AddressError
    from tools_server.registry import ToolError

    assert issubclass(AddressError, ValueError) and not issubclass(AddressError, UpstreamError)
    assert not issubclass(ToolError, UpstreamError)
