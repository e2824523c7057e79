"""Loading a hook object the user names in the config (`shell.policy`): one loader, so that the tool server
that calls the hooks and `ctproxy status` that reports whether they load agree."""

from __future__ import annotations

import importlib
from typing import Any

from proxy.errors import CtproxyError


class SeamConfigError(CtproxyError, ValueError):
    """The configured hook path cannot be loaded."""


def load_hooks(dotted: str | None) -> Any | None:
    """Resolve the hooks object named in config; None when no hook is configured."""
    if not dotted:
        return None
    module_name, sep, attr = dotted.partition(":")
    if not sep:
        module_name, _, attr = dotted.rpartition(".")
    if not module_name or not attr:
        raise SeamConfigError(f"shell.policy must be 'module:attribute', got {dotted!r}")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise SeamConfigError(f"shell.policy {dotted!r} cannot be loaded: {exc}") from exc
    if isinstance(obj, type) or (not (hasattr(obj, "policy") or hasattr(obj, "context")) and callable(obj)):
        obj = obj()  # a class or a factory: build the hooks object once
    if not (hasattr(obj, "policy") or hasattr(obj, "context")):
        raise SeamConfigError(f"shell.policy {dotted!r} has neither policy() nor context()")
    return obj
