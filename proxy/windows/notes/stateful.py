"""A rollover applied to a client that chains by `previous_response_id` (issue 29 (2)), its pure part.

The upstream holds the old window, so the request goes up without `previous_response_id`: the new window's
bootstrap, then the agent's new items. Tool outputs among them answer calls the upstream's stored response
made; without that response an output whose call is not in the input is refused ("No tool call found for
function call output …"). So each output keeps its call: the call is carried from the journal (where the
answer that made it was journaled) right before the output. An output whose call cannot be found is left
out (it would make the whole request fail) and counted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from proxy.items.answers import answered_call, call_key

# fields of a stored call that a stateless resend must not carry (an item id names the stored response's item)
_STORED_ONLY = frozenset({"id"})


@dataclass(frozen=True)
class StatefulInput:
    items: list[Any]  # what follows the bootstrap
    carried: int  # calls carried from the journal
    dropped: int  # outputs left out: their call was nowhere


def missing_calls(items: Sequence[Any]) -> list[str]:
    """The call ids of the outputs in `items` whose call is not before them in `items`."""
    seen: set[tuple[str, str]] = set()
    out: list[str] = []
    for item in items:
        if (key := call_key(item)) is not None:
            seen.add(key)
        elif (ans := answered_call(item)) is not None and ans not in seen:
            out.append(ans[1])
    return out


def carried_call(call: Mapping[str, Any]) -> dict[str, Any]:
    """A journaled call as a stateless request carries it (without the stored response's item id)."""
    return {k: v for k, v in call.items() if k not in _STORED_ONLY}


def stateful_input(items: Sequence[Any], calls: Mapping[str, Mapping[str, Any]]) -> StatefulInput:
    """The agent's new items as they follow the new window's bootstrap: every output right after its call
    (in `items` already, or carried from `calls`, the journal's by call_id); an output whose call is in
    neither is left out."""
    seen: set[tuple[str, str]] = set()
    out: list[Any] = []
    carried = dropped = 0
    for item in items:
        if (key := call_key(item)) is not None:
            seen.add(key)
        elif (ans := answered_call(item)) is not None and ans not in seen:
            call = calls.get(ans[1])
            if call is None or call.get("type") != ans[0]:
                dropped += 1
                continue
            out.append(carried_call(call))
            seen.add(ans)
            carried += 1
        out.append(item)
    return StatefulInput(out, carried, dropped)
