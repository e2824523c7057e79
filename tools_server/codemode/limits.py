"""The numbers of seed 004 §5.7 and §5.9 for code mode, injectable (tests and operators may lower them)."""

from __future__ import annotations

from dataclasses import dataclass

KIB = 1024


@dataclass(frozen=True)
class CellLimits:
    adapter_slots: int = 4  # nested calls executing at once, across all cells of one caller (task, agent)
    max_outstanding_calls: int = 16  # per cell: sent, not yet answered
    max_cumulative_args_bytes: int = 256 * KIB  # per cell: serialized arguments, summed
    max_payload_bytes: int = 256 * KIB  # one argument, one result, one error
    max_queued_reply_bytes: int = 256 * KIB  # replies waiting to enter the cell (freed when delivered)
    max_running_cells: int = 4  # per caller (task, agent): one agent cannot take another's room
    max_running_cells_total: int = 32  # the whole server, all callers together
    max_unread_terminal: int = 16  # per caller: finished cells it has not read yet (its oldest goes first)
    max_wall_time_s: float = 900.0  # a running cell is stopped after this long (seed defect 9)
    max_cpu_time_s: float = 900.0  # CPU seconds of a cell's worker process (RLIMIT_CPU; 0: none)
    terminal_ttl_s: float = 300.0  # an unread terminal record is dropped after five minutes
    output_preview_bytes: int = 256 * KIB  # printed text kept for the model
    result_preview_bytes: int = 32 * KIB  # the returned value, serialized once
    error_preview_bytes: int = 4 * KIB
    final_text_bytes: int = 331_776  # 262,144 + 32,768 + 4,096 + 32,768 control room
    memory_limit_bytes: int = 64 * 1024 * KIB  # heap and ArrayBuffers of a cell (config code_mode.memory_limit_mb)
    max_code_bytes: int = 1024 * KIB  # the source of one cell
