"""The numbers of seed 004 §5.6 and §5.9, in one place so tests and docs can name them."""

from __future__ import annotations

BYTES_PER_TOKEN = 4  # Codex's approximation, used to turn max_output_tokens into a byte budget

# Yield windows (milliseconds), as Codex's unified exec clamps them.
EXEC_YIELD_DEFAULT_MS = 10_000
EXEC_YIELD_MIN_MS = 250
EXEC_YIELD_MAX_MS = 30_000
WRITE_YIELD_DEFAULT_MS = 250
WRITE_YIELD_MIN_MS = 250
WRITE_YIELD_MAX_MS = 30_000
POLL_YIELD_MIN_MS = 5_000
POLL_YIELD_MAX_MS_DEFAULT = 300_000

SETTLE_S = 0.05  # short output and exit come back in one call
GROUP_PROBE_S = 0.05
GROUP_PROBE_SLOW_S = 0.5  # after the first second of a leaderless group

DEFAULT_MAX_OUTPUT_TOKENS = 10_000
MAX_OUTPUT_BYTES_CAP = 2 * 256 * 1024  # both previews at most

PREVIEW_BYTES = 256 * 1024  # rolling preview per stream

STDIN_MAX_OUTSTANDING_BYTES = 262_144
STDIN_MAX_OUTSTANDING_CALLS = 16

MAX_UNSETTLED_JOBS_TOTAL = 128  # the whole server, every (task, agent) together (x-ctp-agent is free text)
MAX_UNSETTLED_JOBS = 16
TERMINAL_HANDLE_TTL_S = 300.0
MAX_TERMINAL_HANDLES = 32

STOP_KILL_AFTER_S = 5.0
STOP_CONFIRM_S = 5.0

# Capture (§5.9): an in-memory prefix per stream, then a private file.
CAPTURE_PREFIX_BYTES = 256 * 1024
CAPTURE_MAX_PENDING_CHUNKS = 16
CAPTURE_MAX_PENDING_BYTES = max(2 * CAPTURE_PREFIX_BYTES, 64 * 1024)
CAPTURE_IO_TIMEOUT_S = 5.0
