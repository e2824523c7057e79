"""The session-owned process manager: ids, ownership, caps, stdin envelope, observation, close.

It exposes narrow start / write / observe / stop / close operations so another entry point
(code mode) can reuse the same instance instead of a second process backend.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from proxy.sandbox.bwrap import (
    UNSANDBOXED,
    Limits,
    backend_for,
    command_argv,
    find_bwrap,
    find_prlimit,
    join_cgroup_argv,
    limits_of,
    pids_cgroup,
    sandbox_problem,
    seccomp_fd,
    seccomp_program,
    socket_dirs,
)
from tools_server.shell import limits
from tools_server.shell.capture import CaptureStore
from tools_server.shell.errors import ShellError
from tools_server.shell.job import Delivery, Job
from tools_server.shell.preview import StreamView, read_both

log = logging.getLogger(__name__)
# Linux MAX_ARG_STRLEN: the most one argv or environment string may take (32 pages)
ARG_MAX_ONE = 131_072

Owner = tuple[str, str]


@dataclass(frozen=True)
class Confinement:
    """Where and how each command runs (issue 33): the sandbox mode and the per-job limits. The default is
    unsandboxed without limits; the shell family builds it from `shell.*` (`confinement_of`)."""

    mode: str = UNSANDBOXED
    network: bool = True
    workspace: Path | None = None
    state_dir: Path | None = None
    limits: Limits = field(default_factory=Limits)


def confinement_of(cfg: Any, workspace: Path | None, state_dir: Path) -> Confinement:
    return Confinement(cfg.sandbox, cfg.network, workspace.resolve() if workspace else None,
                       state_dir.resolve(), limits_of(cfg))


def resolve_shell(configured: str | None, env: Mapping[str, str]) -> str:
    return configured or env.get("SHELL") or "/bin/sh"


@dataclass
class Observation:
    """What one call saw; rendering turns it into Codex's text and structured details."""

    job: Job
    wall_time: float
    stdout: StreamView
    stderr: StreamView
    running: bool
    recovery: dict[str, dict[str, Any]] = field(default_factory=dict)
    input_delivery: Delivery | None = None
    input_bytes: int = 0


def sweep_dead_cgroups(root: Path) -> int:
    """Remove the empty `ctproxy-<pid>-<job>` cgroups of tool servers that are gone (killed before their close
    could remove them); a live server's, or a busy one, stays. Returns how many went."""
    removed = 0
    for path in root.glob("ctproxy-*-*"):
        _, pid, _ = path.name.split("-", 2)
        if not pid.isdigit() or int(pid) == os.getpid() or Path(f"/proc/{pid}").exists():
            continue
        with contextlib.suppress(OSError):  # still holds a process: left alone
            path.rmdir()
            removed += 1
    return removed


class ShellManager:
    def __init__(self, store: CaptureStore, shell: str | None = None,
                 env: Mapping[str, str] | None = None,
                 max_jobs: int = limits.MAX_UNSETTLED_JOBS, max_jobs_total: int = limits.MAX_UNSETTLED_JOBS_TOTAL,
                 kill_after: float = limits.STOP_KILL_AFTER_S,
                 confirm: float = limits.STOP_CONFIRM_S, confinement: Confinement | None = None) -> None:
        self.confinement = confinement or Confinement()
        self._platform = sys.platform  # read once: bubblewrap (Linux) or Seatbelt (macOS)
        linux = backend_for(self._platform) == "bubblewrap"
        self._bwrap = find_bwrap() if linux else None
        self._prlimit = find_prlimit() if linux else None
        self._cgroups = pids_cgroup() if linux else None
        self._seccomp = seccomp_program() if linux else None
        self._tmpdir: Path | None = None  # macOS: the sandboxed jobs' writable TMPDIR (Seatbelt has no private /tmp)
        self._in_cgroups: set[Job] = set()
        self._swept = False  # the cgroups a dead tool server left behind, removed once (seed004 N12)
        self._sandbox_problem: str | None = None
        self._probed = False
        self._env = dict(os.environ if env is None else env)  # captured once; overlays never change it
        self.shell = resolve_shell(shell, self._env)  # resolved once per manager
        self.store = store
        self.max_jobs = max_jobs
        self.max_jobs_total = max(max_jobs_total, max_jobs)
        self.kill_after = kill_after
        self.confirm = confirm
        self._jobs: dict[str, Job] = {}
        self._issued: set[str] = set()
        self._pending_starts: dict[Owner, int] = {}
        self._background: set[asyncio.Task[Any]] = set()
        self.closed = False

    # -- ids and ownership -----------------------------------------------------------------------
    def _new_id(self) -> str:
        # digits only, so a Codex model's numeric session_id names the same handle; never reused
        span = 99_999
        while True:
            if len(self._issued) > span // 2:
                span = span * 10 + 9
            candidate = str(random.randint(1000, span))
            if candidate not in self._issued:
                self._issued.add(candidate)
                return candidate

    def jobs_of(self, owner: Owner) -> list[Job]:
        return [j for j in self._jobs.values() if j.owner == owner]

    def lookup(self, tool: str, owner: Owner, session_id: str) -> Job:
        self._prune(owner)
        job = self._jobs.get(session_id)
        if job is None or job.owner != owner or job.released:
            raise ShellError(tool, "stale-session",
                             f"no live session {session_id} (it finished and was read, or never existed); "
                             "run exec_command again if you still need it")
        return job

    # -- admission -------------------------------------------------------------------------------
    @contextlib.contextmanager
    def admission(self, tool: str, owner: Owner) -> Iterator[None]:
        """Hold a start slot from admission until the job exists (or the start failed)."""
        self._ensure_open(tool)
        self._prune(owner)
        unsettled = sum(1 for j in self.jobs_of(owner) if not j.settled)
        if unsettled + self._pending_starts.get(owner, 0) >= self.max_jobs:
            raise ShellError(tool, "job-cap",
                             f"{self.max_jobs} commands are still running; poll or stop one with "
                             "write_stdin (terminate: true) first")
        everyone = sum(1 for j in self._jobs.values() if not j.settled) + sum(self._pending_starts.values())
        if everyone >= self.max_jobs_total:  # seed 004 defect 19: agent names are free text, so a bound for all
            raise ShellError(tool, "job-cap",
                             f"the server runs {self.max_jobs_total} commands already (all callers); poll or stop "
                             "one with write_stdin (terminate: true), or try again when one has ended")
        self._pending_starts[owner] = self._pending_starts.get(owner, 0) + 1
        try:
            yield
        finally:
            self._pending_starts[owner] -= 1

    def _ensure_open(self, tool: str) -> None:
        if self.closed:
            raise ShellError(tool, "owner-closed", "shell sessions are shut down; nothing was run")

    def _prune(self, owner: Owner) -> None:
        """Terminal handles nobody read: drop after five minutes, or the oldest beyond 32."""
        now = time.monotonic()
        terminal = sorted((j for j in self.jobs_of(owner) if j.settled and not j.released),
                          key=lambda j: j.finished_at or 0.0)
        excess = len(terminal) - limits.MAX_TERMINAL_HANDLES
        for index, job in enumerate(terminal):
            if index < excess or now - (job.finished_at or now) > limits.TERMINAL_HANDLE_TTL_S:
                self._release(job)

    def _release(self, job: Job) -> None:
        job.released = True
        self._jobs.pop(job.id, None)

    # -- start -----------------------------------------------------------------------------------
    async def start(self, tool: str, owner: Owner, cmd: str, cwd: Path, overlay: Mapping[str, str]) -> Job:
        """Spawn once (call inside `admission`). Spawn errors settle at once: no phantom slot."""
        self._ensure_open(tool)
        filter_fd = seccomp_fd(self._seccomp) if self._seccomp is not None and self.confinement.mode != UNSANDBOXED \
            else None
        env = {**self._env, **overlay}  # per-spawn overlay; the manager's env stays as captured
        try:
            in_cgroup = self._cgroups is not None and bool(self.confinement.limits.processes)
            argv = await self._argv(tool, cmd, cwd, filter_fd, prlimit=not in_cgroup, env=env)
            job = Job(self._new_id(), owner, cwd, self.store, kill_after=self.kill_after, confirm=self.confirm)
            if in_cgroup:
                argv = self._in_cgroup(tool, job, argv)
        except BaseException:
            if filter_fd is not None:
                os.close(filter_fd)
            raise
        if self._tmpdir is not None:
            env["TMPDIR"] = str(self._tmpdir)
        try:
            await job.spawn(argv, env, pass_fds=(filter_fd,) if filter_fd is not None else ())
        except OSError as exc:
            job.remove_cgroup()  # nothing joined it
            if exc.errno == errno.E2BIG:  # the command (one argument of the shell) or the environment is too long
                longest = max([len(cmd.encode("utf-8", "replace")),
                               *(len(f"{k}={v}".encode("utf-8", "replace")) for k, v in env.items())])
                raise ShellError(tool, "argument-too-long",
                                 f"the command is too long to start ({len(cmd.encode('utf-8', 'replace'))} bytes; "
                                 f"the system refuses a single argument or environment entry over "
                                 f"{ARG_MAX_ONE} bytes, the longest here is {longest}): write long input to a "
                                 "file or send it with write_stdin instead; nothing was run") from exc
            raise ShellError(tool, "spawn-failed",
                             f"cannot start {self.shell}: {exc.strerror or type(exc).__name__}; "
                             "check shell.shell in the configuration") from exc
        finally:
            if filter_fd is not None:
                os.close(filter_fd)  # the child has its own copy
        if self.closed:  # closed while spawning: this job is ours to stop
            self._jobs[job.id] = job
            await job.stop()
            raise ShellError(tool, "owner-closed", "shell sessions were shut down while starting")
        self._jobs[job.id] = job
        return job

    def _in_cgroup(self, tool: str, job: Job, argv: list[str]) -> list[str]:
        """The job's own pids cgroup (`pids.max` = shell.max_processes): a fork bomb stays inside its job, for
        root too. Cgroups of finished jobs are removed as they end, and here (one that was still busy)."""
        assert self._cgroups is not None
        if not self._swept:
            self._swept = True
            sweep_dead_cgroups(self._cgroups)
        for done in [j for j in self._in_cgroups if j.complete.is_set()]:
            done.remove_cgroup()
            if done.cgroup is None or not done.cgroup.exists():
                self._in_cgroups.discard(done)
        path = self._cgroups / f"ctproxy-{os.getpid()}-{job.id}"
        try:
            path.mkdir(exist_ok=True)
            (path / "pids.max").write_text(f"{self.confinement.limits.processes}\n")
        except OSError as exc:
            raise ShellError(tool, "spawn-failed", f"cannot make the job's pids cgroup ({exc.strerror or exc}); "
                             "nothing was run") from exc
        job.cgroup = path
        self._in_cgroups.add(job)
        return [*join_cgroup_argv(path, self.confinement.limits), *argv]

    async def _remove_cgroups(self, bound: float = 5.0) -> None:
        """At close: every job's cgroup, once the kernel has let go of its last process (bounded)."""
        deadline = time.monotonic() + bound
        while self._in_cgroups:
            for job in list(self._in_cgroups):
                job.remove_cgroup()
                if job.cgroup is None or not job.cgroup.exists():
                    self._in_cgroups.discard(job)
            if not self._in_cgroups or time.monotonic() > deadline:
                break
            await asyncio.sleep(limits.GROUP_PROBE_S)
        if self._in_cgroups:
            log.warning("shell close: %d job cgroup(s) still busy, left in place", len(self._in_cgroups))

    async def _argv(self, tool: str, cmd: str, cwd: Path, filter_fd: int | None = None,
                    prlimit: bool = True, env: Mapping[str, str] | None = None) -> list[str]:
        """The command wrapped where it is spawned, so direct and nested calls get the same sandbox. A sandboxed
        mode that cannot run here refuses: a command never runs unconfined by surprise."""
        box = self.confinement
        if box.mode != UNSANDBOXED:
            if not self._probed:
                self._sandbox_problem = await asyncio.to_thread(sandbox_problem, box.mode, None,
                                                                 self._platform)  # probed once
                self._probed = True
            if self._sandbox_problem is not None or box.workspace is None:
                raise ShellError(tool, "sandbox-unavailable",
                                 f"{self._sandbox_problem or 'a sandboxed mode needs a workspace'}; nothing was run")
        if not os.access(self.shell, os.X_OK) and shutil.which(self.shell) is None:
            # bubblewrap, or the limits' wrapper shell, would start and then fail to exec it (exit 127): say it
            # the way a direct spawn would, in every mode
            raise ShellError(tool, "spawn-failed", f"cannot start {self.shell}: not an executable here; "
                             "check shell.shell in the configuration")
        if box.mode != UNSANDBOXED and backend_for(self._platform) == "seatbelt" and self._tmpdir is None:
            self._tmpdir = Path(tempfile.mkdtemp(prefix="ctproxy-shell-")).resolve()  # mode 0700, removed at close
        # looked up at each spawn: a socket directory made later (Computer Use's desktop) is hidden too
        hide = socket_dirs(self._env if env is None else env) if box.mode != UNSANDBOXED else []
        return command_argv(self.shell, cmd, mode=box.mode, network=box.network, workspace=box.workspace,
                            state_dir=box.state_dir or Path("/nonexistent"), cwd=cwd, limits=box.limits,
                            bwrap=self._bwrap, prlimit=self._prlimit if prlimit else None, seccomp=filter_fd,
                            platform=self._platform, job_tmpdir=self._tmpdir, hide=hide, keep_group=True)

    # -- stdin -----------------------------------------------------------------------------------
    async def write(self, tool: str, job: Job, data: bytes, timeout: float) -> Delivery:
        if job.stdin_state != "open" or job.stop_requested:
            raise ShellError(tool, "stdin-closed",
                             "stdin of this session is closed (EOF sent, or the program closed it); "
                             "nothing was sent")
        if (job.stdin_reserved_bytes + len(data) > limits.STDIN_MAX_OUTSTANDING_BYTES
                or job.stdin_reserved_calls + 1 > limits.STDIN_MAX_OUTSTANDING_CALLS):
            raise ShellError(tool, "stdin-overload",
                             f"too much input outstanding (max {limits.STDIN_MAX_OUTSTANDING_BYTES} bytes, "
                             f"{limits.STDIN_MAX_OUTSTANDING_CALLS} calls); nothing was sent, poll first")
        job.stdin_reserved_bytes += len(data)
        job.stdin_reserved_calls += 1
        delivery: Delivery = "unknown"
        try:
            try:
                job.write_stdin(data)
            except (OSError, RuntimeError) as exc:
                raise ShellError(tool, "stdin-failed", "the pipe refused the input; delivery unknown",
                                 {"inputDelivery": "unknown"}) from exc
            delivery = await job.wait_stdin_flushed(timeout)
            if delivery == "failed":
                raise ShellError(tool, "stdin-failed",
                                 "the program closed stdin before taking the input; delivery unknown",
                                 {"inputDelivery": "unknown"})
            return delivery
        finally:
            if delivery == "unknown" and job.stdin_state == "open":
                # the reservation lasts until the transport settles too
                self._spawn_bg(self._release_stdin_later(job, len(data)))
            else:
                job.stdin_reserved_bytes -= len(data)
                job.stdin_reserved_calls -= 1

    async def _release_stdin_later(self, job: Job, size: int) -> None:
        try:
            while job.stdin_state == "open" and not job.complete.is_set():
                if await job.wait_stdin_flushed(1.0) != "unknown":
                    break
        finally:
            job.stdin_reserved_bytes -= size
            job.stdin_reserved_calls -= 1

    # -- observation -----------------------------------------------------------------------------
    async def wait(self, job: Job, deadline: float, cancel: asyncio.Event | None,
                   detach: asyncio.Event | None = None) -> bool:
        """Wait for completion, the deadline, cancel or detach; True if the call was cancelled. A detached
        call (its caller stopped waiting: a code cell that ended) returns at once; the caller checks it."""
        waiters = [asyncio.ensure_future(job.complete.wait())]
        if cancel is not None:
            waiters.append(asyncio.ensure_future(cancel.wait()))
        if detach is not None:
            waiters.append(asyncio.ensure_future(detach.wait()))
        try:
            await asyncio.wait(waiters, timeout=max(0.0, deadline - time.monotonic()),
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waiters:
                w.cancel()
        if cancel is not None and cancel.is_set():
            return True
        if detach is not None and detach.is_set():
            return False
        if not job.complete.is_set() and (job.leader_exited.is_set()
                                          or all(s.closed for s in job.streams.values())):
            # settle: short trailing output and the exit come back in this call
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(job.complete.wait(), limits.SETTLE_S)
        return False

    async def observe(self, tool: str, job: Job, started: float, budget: int) -> Observation:
        """The destructive read: serialized per job, re-checks the handle, one terminal winner."""
        async with job.observe_lock:
            if job.released or self._jobs.get(job.id) is not job:
                raise ShellError(tool, "stale-session",
                                 f"session {job.id} was already finished and read by another call")
            terminal = job.complete.is_set()
            out_view, err_view = read_both(job.streams[1].preview.drain(),
                                           job.streams[2].preview.drain(), budget)
            recovery: dict[str, dict[str, Any]] = {}
            for fd, name, view in ((1, "stdout", out_view), (2, "stderr", err_view)):
                stream = job.streams[fd]
                stream.clipped = stream.clipped or view.clipped
                # a running job publishes stable paths; a terminal one only where output was lost
                if not terminal or stream.clipped or stream.published or not stream.capture.in_memory:
                    await stream.capture.ensure_file()
                    stream.published = True
                if terminal:
                    await stream.capture.settle()
                snap = stream.capture.snapshot()
                if snap is not None:
                    recovery[name] = snap
            if terminal:
                self._release(job)  # the terminal observer wins; later calls get stale-session
            return Observation(job=job, wall_time=time.monotonic() - started, stdout=out_view,
                               stderr=err_view, running=not terminal, recovery=recovery)

    async def stop(self, job: Job) -> bool:
        return await job.stop()

    async def abandon(self, owner: Owner, session_id: str) -> bool:
        """Stop a session nobody can ever name (a code cell whose client hung up before its ID was returned,
        seed004 N6) and drop its handle; False when it is not this owner's or is gone already."""
        job = self._jobs.get(session_id)
        if job is None or job.owner != owner:
            return False
        await job.stop()
        self._release(job)
        return True

    def stop_in_background(self, job: Job) -> None:
        """For a cancelled direct call: the job must stop even though nobody waits for it."""
        self._spawn_bg(job.stop())

    def _spawn_bg(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # -- close -----------------------------------------------------------------------------------
    async def close(self) -> int:
        """Stop every group and remove our capture files; returns how many stops are unconfirmed."""
        self.closed = True
        jobs = list(self._jobs.values())
        results = await asyncio.gather(*(j.stop() for j in jobs), return_exceptions=True)
        unconfirmed = [j for j, ok in zip(jobs, results, strict=True) if ok is not True]
        for job in jobs:
            if job not in unconfirmed:
                for stream in job.streams.values():
                    await stream.capture.settle()
            job.force_close()
        for task in list(self._background):
            task.cancel()
        # keep the files of groups we could not confirm gone: they are still someone's responsibility
        keep = {s.capture.path for j in unconfirmed for s in j.streams.values() if s.capture.path}
        removed = await asyncio.to_thread(self.store.cleanup, keep)
        await self._remove_cgroups()
        if self._tmpdir is not None:
            await asyncio.to_thread(shutil.rmtree, self._tmpdir, True)
        self._jobs.clear()
        if unconfirmed:
            log.warning("shell close: %d process group(s) not confirmed gone (cleanup-incomplete)",
                        len(unconfirmed))
        log.debug("shell close: stopped %d job(s), removed %d capture file(s)", len(jobs), removed)
        return len(unconfirmed)
