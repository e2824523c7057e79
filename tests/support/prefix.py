"""The prefix rule (issue 47), checked on what the emulator received: inside one window each forwarded request's
`tools`, `instructions` and input items (after its `previous_response_id` chain's) extend the previous request's
byte for byte. The prompts are the emulator's prompt-cache view (tests/emulator/cache.py, `rec.extra["cache"]`),
so a stateful chain is compared whole, as the upstream caches it.

    breaks = prefix_breaks(emulator.responses_requests)
    assert [b.index for b in breaks] == opened_at   # a window changes the prefix once, when it opens
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from tests.emulator import ReceivedRequest
from tests.emulator.cache import first_difference, part_name


@dataclass(frozen=True)
class PrefixBreak:
    index: int  # which request (among those compared, 0-based) did not extend the one before it
    part: str  # the first part it changed: tools, instructions or input[k]
    before: bytes  # that part as the previous request had it
    after: bytes | None  # … and as this one has it (None: left out)

    def __str__(self) -> str:
        return f"request {self.index}: {self.part} changed\n  was: {self.before[:400]!r}\n  now: {self.after!r:.400}"


def prompts(records: Iterable[ReceivedRequest]) -> list[list[bytes]]:
    """The prompt of every request the emulator answered (a refused one never reached the cache)."""
    return [r.extra["cache"].parts for r in records if "cache" in r.extra]


def prefix_breaks(records: Iterable[ReceivedRequest]) -> list[PrefixBreak]:
    """Each request whose prompt does not extend its predecessor's (in the same prompt_cache_key bucket)."""
    out: list[PrefixBreak] = []
    last: dict[str | None, list[bytes]] = {}
    answered = [r for r in records if "cache" in r.extra]
    for index, rec in enumerate(answered):
        result = rec.extra["cache"]
        before = last.get(result.bucket)
        if before is not None and (at := first_difference(before, result.parts)) is not None:
            out.append(PrefixBreak(index, part_name(at), before[at],
                                   result.parts[at] if at < len(result.parts) else None))
        last[result.bucket] = result.parts
    return out
