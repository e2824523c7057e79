"""One send per connection and event-loop turn, instead of one per chunk.

mitmproxy writes every command's bytes to the socket as it goes: a Responses stream of 200 events, read from
the upstream in a few large reads, left the proxy in 200 `send()` calls and reached the agent in as many TCP
segments. The syscall and asyncio's write path per chunk were the largest single cost of a stream, on both
sides of the socket (the agent reads each segment). Here the writes a connection gets in one loop turn are
joined and sent once, at the end of the turn:

- a turn's first two writes still go out at once — an answer's head and its first chunk (or event), so the
  first event reaches the agent without waiting for the rest of what arrived with it;
- the rest leave together when the turn's work is done (a `call_soon` after it), or sooner when mitmproxy
  drains the writer before it reads again, closes it or half-closes it;
- nothing waits for more data or for a timer: a chunk leaves in the turn that produced it, so streaming stays
  streaming, and bytes keep their order (a write after a held one is held behind it).

mitmproxy keeps each connection's `asyncio.StreamWriter` in a `ConnectionIO`; `install()` makes the writers
it stores there batch theirs (the writer's class is swapped for a subclass, the same object stays, so asyncio's
own references to it are untouched). Other streams (mitmproxy_rs' UDP and WireGuard ones) are left as they are.
`addons/routing.py` and the embedded master call `install()`, so `ctproxy up` and `mitmdump -s addons/all.py`
behave the same.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Any

log = logging.getLogger("ctproxy.upstream")

IMMEDIATE_WRITES = 2  # per turn: an answer's head and its first chunk go out as they come

_installed = False


class BatchingWriter(asyncio.StreamWriter):
    """A StreamWriter whose writes of one loop turn leave in one `transport.write` (beyond the first two)."""

    __slots__ = ()  # the layout of StreamWriter's: an existing writer's class can be swapped for this one

    _held: list[bytes] | None  # this turn's held writes; None: no turn open
    _written: int  # writes of this turn so far

    def write(self, data: Any) -> None:
        held = self._held
        if held is None:  # the turn's first write: open the turn, sent at its end
            self._held = held = []
            self._written = 0
            self._loop.call_soon(self.flush)
        self._written += 1
        if self._written <= IMMEDIATE_WRITES and not held:
            self._transport.write(data)
            return
        held.append(bytes(data))

    def flush(self) -> None:
        """Send what this turn held, in one write, and close the turn."""
        held, self._held = self._held, None
        if held and not self._transport.is_closing():
            self._transport.write(held[0] if len(held) == 1 else b"".join(held))

    def write_eof(self) -> None:
        self.flush()
        return super().write_eof()

    def close(self) -> None:
        self.flush()
        return super().close()

    async def drain(self) -> None:
        self.flush()  # mitmproxy drains before it reads again: the turn's bytes go now, and backpressure holds
        await super().drain()


def batching(writer: Any) -> Any:
    """`writer` made a BatchingWriter when it is a plain asyncio StreamWriter; anything else as it is."""
    if type(writer) is asyncio.StreamWriter:
        writer.__class__ = BatchingWriter
        writer._held = None
        writer._written = 0
    return writer


def install() -> bool:
    """Make the writers mitmproxy keeps per connection batch their writes, once per process. False when this
    mitmproxy lacks what we wrap (its own behaviour then stays, and a warning says so)."""
    global _installed
    if _installed:
        return True
    try:
        from mitmproxy.proxy import server

        original = server.ConnectionIO
        if not dataclasses.is_dataclass(original) or "writer" not in {f.name for f in dataclasses.fields(original)}:
            raise AttributeError("ConnectionIO has no writer field")
    except (ImportError, AttributeError) as exc:
        log.warning("ctproxy: one send per turn unavailable with this mitmproxy (%s)", exc)
        return False

    @dataclasses.dataclass
    class ConnectionIO(original):  # type: ignore[valid-type, misc]
        def __post_init__(self) -> None:
            self.writer = batching(self.writer)

    ConnectionIO.__qualname__ = ConnectionIO.__name__ = original.__name__
    server.ConnectionIO = ConnectionIO
    _installed = True
    return True
