"""mitmproxy's debug-mode message type check, without the reference cycles that pin every flow.

Under `__debug__` (a plain `python`), every `mitmproxy.http.RequestData` / `ResponseData` checks its fields
with `mitmproxy.utils.typecheck.check_option_type`. For a `bytes | None` field holding None it tries
`bytes` first: the nested call builds a `TypeError`, raises it and the caller swallows it. Each such
exception keeps its traceback, whose frames keep the exception (a cycle) and, through `f_back`, the
caller frames that were running — mitmproxy's layers, hence the flow, its parsed body and answer. Six
per exchange (content, trailers, timestamp_end of a request and of a response). So no flow was freed
when it ended: every one waited for the cyclic collector, which walked those bodies again and again
(measured in `ctproxy up`, 80 requests of 1.5 MB: 14 second-generation collections of ≈20 ms each, and
7 of 10 flows found in cyclic garbage; see docs/benchmarks.md, session 5).

`install()` replaces the module's function by one that decides with a pure predicate first (no
exception when the value fits) and falls back to mitmproxy's own function when it does not, so a
mismatch raises exactly the error mitmproxy raises (options keep their messages). Idempotent.
"""

from __future__ import annotations

import typing
from collections import abc
from types import UnionType
from typing import Any

from mitmproxy.utils import typecheck

_original = typecheck.check_option_type


def fits(value: Any, typeinfo: Any) -> bool:
    """What `check_option_type` accepts, as a predicate (the same cases, in the same order)."""
    origin = typing.get_origin(typeinfo)
    if origin is typing.Union or origin is UnionType:
        return any(fits(value, t) for t in typing.get_args(typeinfo))
    if origin is tuple:
        types = typing.get_args(typeinfo)
        return (isinstance(value, (tuple, list)) and len(types) == len(value)
                and all(fits(x, t) for x, t in zip(value, types, strict=True)))
    if origin is abc.Sequence:
        item_type = typing.get_args(typeinfo)[0]
        return isinstance(value, (tuple, list)) and all(fits(v, item_type) for v in value)
    if origin is typing.IO or typeinfo in (typing.TextIO, typing.BinaryIO):
        return hasattr(value, "read")
    if typeinfo is typing.Any:
        return True
    try:
        return isinstance(value, typeinfo) or (typeinfo is float and isinstance(value, int))
    except TypeError:  # a parameterized generic mitmproxy does not know: its own function decides
        return False


def _plain_classes(typeinfo: Any) -> tuple[type, ...] | None:
    """The classes an `isinstance` check stands for, when `typeinfo` is a class or a union of classes
    (all of a message's fields): then one `isinstance` decides, as `fits` would."""
    members = typing.get_args(typeinfo) if typing.get_origin(typeinfo) in (typing.Union, UnionType) else (typeinfo,)
    special = (typing.Any, typing.TextIO, typing.BinaryIO)  # not plain isinstance checks in `fits`
    if all(isinstance(m, type) and typing.get_origin(m) is None and m not in special for m in members):
        return (*members, int) if float in members else tuple(members)  # a float field takes an int too
    return None


_PLAIN: dict[Any, tuple[type, ...] | None] = {}  # typeinfo → its classes (the few types mitmproxy declares)


def check_option_type(name: str, value: Any, typeinfo: Any) -> None:
    try:
        plain = _PLAIN[typeinfo]
    except KeyError:
        plain = _PLAIN[typeinfo] = _plain_classes(typeinfo)
    except TypeError:  # an unhashable type description
        plain = None
    if plain is not None and isinstance(value, plain):
        return
    if plain is None and fits(value, typeinfo):
        return
    _original(name, value, typeinfo)  # raises mitmproxy's own TypeError (a rare path: cycles do not matter)


def install() -> None:
    typecheck.check_option_type = check_option_type


def installed() -> bool:
    return typecheck.check_option_type is check_option_type
