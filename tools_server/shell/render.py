"""Result text in Codex's unified-exec layout, plus structured details for REST/MCP. Pure."""

from __future__ import annotations

import secrets
from typing import Any

from tools_server.shell import limits
from tools_server.shell.manager import Observation
from tools_server.shell.preview import StreamView


def _tokens(n_bytes: int) -> int:
    return -(-n_bytes // limits.BYTES_PER_TOKEN)


def _stream_details(view: StreamView) -> dict[str, Any]:
    return {
        "text": view.text,
        "bytes": view.total_bytes,
        "shownBytes": view.shown_bytes,
        "dropped": view.dropped_bytes,
        "truncated": view.truncated_bytes,
    }


def render(obs: Observation, chunk_id: str | None = None) -> tuple[str, dict[str, Any]]:
    job = obs.job
    chunk_id = chunk_id or secrets.token_hex(3)
    out, err = obs.stdout, obs.stderr
    raw_bytes = out.total_bytes + err.total_bytes
    lines = [f"Chunk ID: {chunk_id}", f"Wall time: {obs.wall_time:.4f} seconds"]
    if not obs.running:
        lines.append(f"Process exited with code {job.exit_code}")
    else:
        lines.append(f"Process running with session ID {job.id}")
    if obs.input_delivery == "unknown":
        lines.append("Input delivery unknown: the pipe had not taken all bytes yet; do not resend blindly")
    if job.stop_requested and obs.running:
        lines.append(f"Stop not confirmed: session ID {job.id} is kept; poll or stop again with write_stdin")
    lines.append(f"Original token count: {_tokens(raw_bytes)}")
    for name, snap in obs.recovery.items():
        if "path" in snap and snap["state"] != "unavailable":
            lines.append(f"Full {name} ({snap['state']}, {snap['bytes']} bytes): {snap['path']}")
        else:
            lines.append(f"Full {name} unavailable ({snap.get('reason', snap['state'])})")
    lines.append("Output:")
    body = []
    if out.clipped or err.clipped:
        body.append(f"Warning: truncated output (original token count: {_tokens(raw_bytes)})\n"
                    f"Total output lines: {out.lines + err.lines}\n")
    body.append(out.text)
    if err.text or err.truncated_bytes:
        if body[-1] and not body[-1].endswith("\n"):
            body.append("\n")
        body.append("Stderr:\n" + err.text)
        if err.truncated_bytes and not err.text:
            body.append(f"…{_tokens(err.truncated_bytes)} tokens truncated…")
    text = "\n".join(lines) + "\n" + "".join(body)

    details: dict[str, Any] = {
        "chunk_id": chunk_id,
        "wall_time_seconds": round(obs.wall_time, 4),
        "original_token_count": _tokens(raw_bytes),
        "status": "running" if obs.running else "exited",
        "stdout": _stream_details(out),
        "stderr": _stream_details(err),
        "recovery": obs.recovery,
    }
    if obs.running:
        details["session_id"] = job.id
    else:
        details["exit_code"] = job.exit_code
        if job.signal_name:
            details["signal"] = job.signal_name
    if job.stop_requested:
        details["terminated"] = True
        details["unknownOutcome"] = obs.running
    if obs.input_delivery is not None:
        details["inputDelivery"] = obs.input_delivery
        details["inputBytes"] = obs.input_bytes
    details["stdinOpen"] = job.stdin_state == "open" and not job.stop_requested
    return text, details
