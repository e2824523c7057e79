"""One command: a shell in its own process group, its pipes, preview, capture and stop.

Completion means: the leader exited, no live process is left in its group, and both
output streams are closed. The command is started once and never replayed.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Literal

from tools_server.shell import limits
from tools_server.shell.capture import CaptureStore, StreamCapture
from tools_server.shell.preview import RollingPreview, StreamDecoder
from tools_server.shell.procgroup import group_alive, signal_group

_PIPE_BYTES = 1024 * 1024
StdinState = Literal["open", "closed", "broken"]
Delivery = Literal["written", "unknown", "failed"]


def _widen_pipe(pipe: Any) -> None:
    """Fewer, larger reads for chatty commands (Linux F_SETPIPE_SZ; best effort)."""
    setsz = getattr(fcntl, "F_SETPIPE_SZ", None)
    if pipe is None or setsz is None:
        return
    with contextlib.suppress(OSError, ValueError, AttributeError):
        fcntl.fcntl(pipe.get_extra_info("pipe").fileno(), setsz, _PIPE_BYTES)


class _Stream:
    def __init__(self, job: Job, fd: int, label: str, store: CaptureStore) -> None:
        self.fd = fd
        self.decoder = StreamDecoder()
        self.preview = RollingPreview()
        self.capture = StreamCapture(store, label, on_room=lambda: job._resume_reading(fd))
        self.closed = False
        self.paused = False
        self.clipped = False  # some read lost preview output: the capture file must be published
        self.published = False


class _Protocol(asyncio.SubprocessProtocol):
    def __init__(self, job: Job) -> None:
        self.job = job

    def pipe_data_received(self, fd: int, data: bytes | str) -> None:
        self.job._on_data(fd, data if isinstance(data, bytes) else data.encode())

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        self.job._on_pipe_lost(fd, exc)

    def process_exited(self) -> None:
        self.job._on_exit()

    def pause_writing(self) -> None:
        self.job._stdin_flushed.clear()

    def resume_writing(self) -> None:
        self.job._stdin_flushed.set()


class Job:
    def __init__(self, job_id: str, owner: tuple[str, str], cwd: Path, store: CaptureStore,
                 kill_after: float = limits.STOP_KILL_AFTER_S,
                 confirm: float = limits.STOP_CONFIRM_S) -> None:
        self.id = job_id
        self.owner = owner
        self.cwd = cwd
        self.kill_after = kill_after
        self.confirm = confirm
        self.started_at = time.monotonic()
        self.finished_at: float | None = None
        self.pid = 0
        self.returncode: int | None = None
        self.streams = {1: _Stream(self, 1, "stdout", store), 2: _Stream(self, 2, "stderr", store)}
        self.leader_exited = asyncio.Event()
        self.group_gone = False
        self.complete = asyncio.Event()
        self.observe_lock = asyncio.Lock()
        self.released = False  # a terminal observer won; the handle is stale from now on
        self.stdin_state: StdinState = "open"
        self.stdin_reserved_bytes = 0
        self.stdin_reserved_calls = 0
        self._stdin_flushed = asyncio.Event()
        self._stdin_flushed.set()
        self._stdin_closing = False
        self.stop_requested = False
        self.stop_unconfirmed = False
        self.killed = False
        self._term_sent = False
        self._stop_task: asyncio.Task[bool] | None = None
        self._probe_task: asyncio.Task[None] | None = None
        self._transport: asyncio.SubprocessTransport | None = None
        self.cgroup: Path | None = None  # its own pids cgroup, when the manager made one

    # -- start ---------------------------------------------------------------------------------
    async def spawn(self, argv: list[str], env: dict[str, str], pass_fds: tuple[int, ...] = ()) -> None:
        """Start `argv` (the shell, wrapped by the sandbox and the limits: proxy/sandbox/bwrap.command_argv)."""
        loop = asyncio.get_running_loop()
        transport, _ = await loop.subprocess_exec(
            lambda: _Protocol(self), *argv,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            cwd=str(self.cwd), env=env, start_new_session=True, pass_fds=pass_fds,
        )
        self._transport = transport
        self.pid = transport.get_pid()
        for fd in (1, 2):
            _widen_pipe(transport.get_pipe_transport(fd))
        stdin = transport.get_pipe_transport(0)
        if stdin is not None:
            # buffer nothing before telling us: "written" means the pipe took every byte
            stdin.set_write_buffer_limits(high=0)  # type: ignore[attr-defined]
        if transport.get_returncode() is not None and not self.leader_exited.is_set():
            self._on_exit()

    @property
    def pgid(self) -> int:
        return self.pid  # start_new_session: the leader's pid names the group

    # -- protocol callbacks ----------------------------------------------------------------------
    def _on_data(self, fd: int, data: bytes) -> None:
        stream = self.streams.get(fd)
        if stream is None:
            return
        text = stream.decoder.feed(data)
        stream.preview.append(text)
        stream.capture.feed(text)
        if stream.capture.over_limit() and not stream.paused and self._transport is not None:
            pipe = self._transport.get_pipe_transport(fd)
            if pipe is not None:
                pipe.pause_reading()  # type: ignore[attr-defined]
                stream.paused = True

    def _resume_reading(self, fd: int) -> None:
        stream = self.streams[fd]
        if stream.paused and not stream.capture.over_limit() and self._transport is not None:
            stream.paused = False
            pipe = self._transport.get_pipe_transport(fd)
            if pipe is not None and not pipe.is_closing():
                pipe.resume_reading()  # type: ignore[attr-defined]

    def _on_pipe_lost(self, fd: int, exc: Exception | None) -> None:
        if fd == 0:
            if not self._stdin_closing or exc is not None:
                self.stdin_state = "broken"
            else:
                self.stdin_state = "closed"
            self._stdin_flushed.set()
            return
        stream = self.streams.get(fd)
        if stream is None or stream.closed:
            return
        tail = stream.decoder.finish()
        stream.preview.append(tail)
        stream.capture.feed(tail)
        stream.capture.close_source(error=exc is not None)
        stream.closed = True
        self._check_complete()

    def _on_exit(self) -> None:
        if self.leader_exited.is_set() or self._transport is None:
            return
        self.returncode = self._transport.get_returncode()
        self.leader_exited.set()
        self._probe_task = asyncio.get_running_loop().create_task(self._probe_group())

    async def _probe_group(self) -> None:
        # after the leader: ordinary same-group children are still part of the job
        exited = time.monotonic()
        while True:
            if not await asyncio.to_thread(group_alive, self.pgid):
                self.group_gone = True
                self._check_complete()
                return
            # a long-lived background child is probed less often (each probe scans /proc),
            # except while a stop waits for confirmation
            slow = not self.stop_requested and time.monotonic() - exited > 1.0
            await asyncio.sleep(limits.GROUP_PROBE_SLOW_S if slow else limits.GROUP_PROBE_S)

    def _check_complete(self) -> None:
        if self.complete.is_set():
            return
        if self.leader_exited.is_set() and self.group_gone and all(s.closed for s in self.streams.values()):
            self.finished_at = time.monotonic()
            self.complete.set()
            self.remove_cgroup()
            if self._transport is not None:
                self._transport.close()

    def remove_cgroup(self) -> None:
        """Best effort: a cgroup still busy is removed by the manager's next start."""
        if self.cgroup is not None:
            with contextlib.suppress(OSError):
                self.cgroup.rmdir()

    # -- status ----------------------------------------------------------------------------------
    @property
    def settled(self) -> bool:
        return self.complete.is_set()

    @property
    def exit_code(self) -> int | None:
        if self.returncode is None:
            return None
        return self.returncode if self.returncode >= 0 else 128 - self.returncode

    @property
    def signal_name(self) -> str | None:
        if self.returncode is None or self.returncode >= 0:
            return None
        try:
            return signal.Signals(-self.returncode).name
        except ValueError:
            return f"signal {-self.returncode}"

    # -- stdin -----------------------------------------------------------------------------------
    def _stdin_pipe(self) -> Any:
        return None if self._transport is None else self._transport.get_pipe_transport(0)

    def write_stdin(self, data: bytes) -> None:
        """Hand bytes to the pipe transport (never blocks). The caller checked the state."""
        pipe = self._stdin_pipe()
        if pipe is None or pipe.is_closing():
            self.stdin_state = "broken"
            raise BrokenPipeError("stdin is closed")
        pipe.write(data)

    async def wait_stdin_flushed(self, timeout: float) -> Delivery:
        """`written`: the pipe accepted every byte so far (not that the program read them)."""
        pipe = self._stdin_pipe()
        if pipe is not None and pipe.get_write_buffer_size() == 0 and self.stdin_state != "broken":
            return "written"
        try:
            await asyncio.wait_for(self._stdin_flushed.wait(), max(0.0, timeout))
        except TimeoutError:
            return "unknown"
        if self.stdin_state == "broken":
            return "failed"
        return "written"

    def close_stdin(self) -> None:
        """EOF after the bytes already accepted; harmless when repeated."""
        if self.stdin_state != "open" or self._stdin_closing:
            return
        self._stdin_closing = True
        pipe = self._stdin_pipe()
        if pipe is None:
            self.stdin_state = "closed"
            return
        pipe.write_eof()  # closes once the buffer is flushed

    # -- stop --------------------------------------------------------------------------------------
    async def stop(self) -> bool:
        """SIGTERM to the group, SIGKILL after the grace period; True once confirmed gone."""
        if self.complete.is_set():
            return True
        if self._stop_task is None or self._stop_task.done():
            self._stop_task = asyncio.get_running_loop().create_task(self._stop_sequence())
        return await asyncio.shield(self._stop_task)

    async def _stop_sequence(self) -> bool:
        self.stop_requested = True
        pipe = self._stdin_pipe()
        if pipe is not None and not pipe.is_closing():
            self._stdin_closing = True
            pipe.abort()
        if not self._term_sent:
            self._term_sent = True
            signal_group(self.pgid, signal.SIGTERM)
            if await self._wait_gone(self.kill_after):
                self.stop_unconfirmed = False
                return True
        self.killed = True
        signal_group(self.pgid, signal.SIGKILL)
        confirmed = await self._wait_gone(self.confirm)
        self.stop_unconfirmed = not confirmed
        return confirmed

    async def _wait_gone(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.complete.is_set():
                return True
            if self.leader_exited.is_set() and self.group_gone:
                # only processes outside the group still hold our pipes: stop reading them
                self._close_read_pipes()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.complete.wait(), min(limits.GROUP_PROBE_S,
                                                                 max(0.0, deadline - time.monotonic())))
        return self.complete.is_set()

    def _close_read_pipes(self) -> None:
        if self._transport is None:
            return
        for fd in (1, 2):
            pipe = self._transport.get_pipe_transport(fd)
            if pipe is not None and not pipe.is_closing():
                pipe.close()

    def force_close(self) -> None:
        """Last resort at shutdown: drop our side of everything."""
        if self._probe_task is not None:
            self._probe_task.cancel()
        if self._transport is not None:
            self._transport.close()
        for stream in self.streams.values():
            stream.capture.abort("owner-closed")
