"""What the request path leaves for later: a request to align, an answer to append.

The request path of the proxy only snapshots the input (one orjson call) and appends to the journal's
backlog; aligning, hashing and building the writes happen in order when the writer next drains, or as
soon as anything reads a session's state (the next request's alignment, the windows API, a flush).
Measured on the proxy (bench/bench_journal.py), doing that work inline cost ≈250 µs of every streamed
turn's latency, from a cold cache. The snapshot keeps what the client sent even if a later addon
edits the payload before then.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from proxy.items.jsonbytes import dumps_kept
from proxy.journal.itemids import ItemIds

if TYPE_CHECKING:
    from proxy.journal.branch import Branch
    from proxy.journal.model import SessionState


class RequestMark:
    """What the journal made of one request; kept in the flow state for the response and later addons.

    A mark can be handed out before its request is aligned: reading what the alignment decides
    (`window_id`, `input_ids`, `kind`, `tail`, `branch`) settles the journal's backlog first."""

    __slots__ = (
        "_branch",
        "_done",
        "_input_ids",
        "_kind",
        "_settle",
        "_tail",
        "_window_id",
        "address",
        "failed",
        "minted",
        "response_done",
        "session_key",
        "state",
        "task_id",
    )

    def __init__(self, session_key: str, task_id: str, address: str, state: SessionState | None = None,
                 settle: Callable[[], None] | None = None):
        self.session_key = session_key
        self.task_id = task_id
        self.address = address
        self.response_done = False
        self.failed = False  # the request could not be journaled; neither is its answer
        self.minted = False  # this request opened the session (proxy.session.minted_for): nothing was recorded of it
        self.state = state
        self._settle = settle
        self._done = False
        self._window_id = ""
        self._input_ids = ItemIds()
        self._kind = "pending"
        self._tail: str | None = None
        self._branch: Branch | None = None

    def resolve(self, window_id: str, input_ids: Sequence[str], kind: str, tail: str | None,
                branch: Branch) -> None:
        self._window_id, self._input_ids, self._kind, self._tail, self._branch = (window_id, ItemIds.of(input_ids),
                                                                                   kind, tail, branch)
        self._done = True

    def fail(self, window_id: str) -> None:
        self.failed = True
        self._window_id, self._kind = window_id, "failed"
        self._done = True

    def _wait(self) -> None:
        if not self._done and self._settle is not None:
            self._settle()

    @property
    def settled(self) -> bool:
        return self._done

    @property
    def window_id(self) -> str:
        self._wait()
        return self._window_id

    @property
    def input_ids(self) -> ItemIds:
        """The journal id of every input item, in input order ("" for one without)."""
        self._wait()
        return self._input_ids

    def position_of(self, item_id: str) -> int | None:
        """The index of the input item the journal aligned with `item_id` (a window's boundary item), or
        None. Unlike a positional check this follows the journal's alignment: an agent that left out an
        item the journal keeps (a reasoning item) still finds its boundary."""
        return self.input_ids.last_index(item_id)

    @property
    def kind(self) -> str:
        """Alignment kind: new | continue | trimmed | prefix | compaction | diverged | stateful (| failed)."""
        self._wait()
        return self._kind

    @property
    def tail(self) -> str | None:
        """The last item of the branch after this request."""
        self._wait()
        return self._tail

    @property
    def branch(self) -> Branch | None:
        self._wait()
        return self._branch

    def __repr__(self) -> str:
        state = f"{self._kind}, {len(self._input_ids)} items" if self._done else "pending"
        return f"RequestMark({self.session_key!r}, {self.task_id!r}, {self.address!r}, {state})"


@dataclass(slots=True)
class PendingRequest:
    mark: RequestMark
    whole: bytes | memoryview | None  # the input list's bytes: the client's own (a view of its body, copied by
    # the writer), or orjson's (None: not yet, see `serialized`)
    previous_response_id: str | None
    items: list[Any] | None = None  # the items themselves, when the caller guarantees they stay unchanged
    queued_at: float = field(default_factory=time.monotonic)  # the crash-loss window counts from here
    prepared: Prepared | None = None  # per-item work done before taking the journal's lock (big inputs)

    def serialized(self) -> bytes:
        """The input list's bytes (what the resend prefix is compared on): the client's own when the request path
        had them (a big body), else the items as orjson writes them, made on first use by the writer, off the
        request path. Two threads may both make it; the bytes are the same."""
        whole = self.whole
        if whole is None:
            whole = self.whole = dumps_kept(self.items)  # kept as the session's last input
        elif isinstance(whole, memoryview):
            whole = self.whole = bytes(whole)
        return whole


@dataclass(slots=True)
class Prepared:
    """The items a big request's alignment will look at, parsed and serialized (and hashed, for a session
    with nothing on its branch yet) outside the journal's lock. Valid while the session's resend state is
    the one it was prepared against (`resend`, compared by identity); the values themselves are pure
    functions of the snapshot, so a stale preparation is only ignored, never wrong."""

    resend: Any  # the (generation, Resend) entry used, or None: `view` covers the whole input
    head: int  # input items before `view` (resolved by the byte prefix)
    view: Any  # proxy.journal.branch.InputView over the items from `head` on


@dataclass(slots=True)
class PendingResponse:
    mark: RequestMark
    snapshot: bytes | None  # the output items serialized by orjson when the answer passed
    items: list[Any] | None  # or the items themselves (the synchronous API)
    response_id: str | None
    model: str | None
    status: str | None
    usage: dict[str, Any] | None
    error: dict[str, Any] | None
    incomplete: bool
    created_at: float
    ids: list[str] | None = None  # filled when journaled: the output items' ids
    queued_at: float = field(default_factory=time.monotonic)


Pending = PendingRequest | PendingResponse
