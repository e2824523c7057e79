"""One code-mode cell's V8 isolate in its own process, with the kernel bounding what the cell may allocate.

Run by tools_server/codemode/process.py as `python -I worker.py MEMORY_LIMIT CPU_SECONDS SLACK`; imports only
the standard library and mini-racer (it is started by path, not as a package module, so it loads nothing
of the server). It speaks JSON lines: on stdout first `{"ready": …}`, then one reply per request read
from stdin:

    {"id": N, "op": "eval", "code": "…"}  ->  {"id": N, "ok": true, "v": …, "hard": false}
                                          or  {"id": N, "ok": false, "kind": "memory"|"js"|"cancelled"|…}
    {"id": N, "op": "cancel"}             ->  (the eval N, if still running, answers "cancelled")

Why a process: mini-racer's hard limit bounds the V8 heap only. `ArrayBuffer` backing stores come from
V8's array-buffer allocator, outside the heap, and mini-racer has no setting that bounds it. This build
of V8 runs with its sandbox on: it reserves about 1.4 TB of address space up front and places every
backing store inside that reservation, so `RLIMIT_AS` cannot work (the reservation alone exceeds any
useful limit, and committing pages inside it does not grow the address space). What a backing store does
grow is the private writable memory the kernel counts as data (`VmData`, made writable by `mprotect`),
which `RLIMIT_DATA` bounds. So the worker boots V8 and one isolate, measures its data size, and sets
`RLIMIT_DATA` to that plus the cell's limit plus a little slack for its own messages: an allocation past
it fails (V8 throws `RangeError: Array buffer allocation failed`, or the worker dies), never the server.
`RLIMIT_CPU` stops a cell that spins past its CPU time (SIGXCPU). The worker exits when stdin closes, so it
never outlives the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import math
import os
import resource
import sys
import threading
from typing import Any

from py_mini_racer import JSEvalException, JSOOMException, MiniRacer

EXIT_MEMORY = 3  # the worker's own Python ran out of the cell's memory (what it needs for a message)
EXIT_SETUP = 4  # the limits could not be set: the cell must not run unbounded


def _data_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmData:"):
                return int(line.split()[1]) * 1024
    raise OSError("VmData not found in /proc/self/status")


def _within(which: int, wanted: int) -> int:
    """`wanted`, or the hard limit the worker inherited when that is lower (a process may only lower it)."""
    hard = resource.getrlimit(which)[1]
    return wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)


def _die_with_parent() -> None:
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL


def _send(msg: dict[str, Any]) -> None:
    try:
        data = json.dumps(msg).encode("ascii") + b"\n"
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
    except MemoryError:
        os._exit(EXIT_MEMORY)
    except (BrokenPipeError, OSError):
        os._exit(0)


def main() -> None:
    memory_limit, cpu_seconds, slack = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
    _die_with_parent()
    asyncio.run(serve(memory_limit, cpu_seconds, slack))


async def serve(memory_limit: int, cpu_seconds: float, slack: int) -> None:
    loop = asyncio.get_running_loop()
    mr = MiniRacer()  # in the running loop: mini-racer answers on it (else it starts a loop thread of its own)
    mr.set_hard_memory_limit(memory_limit)
    mr.eval("0")
    try:
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        base: int | None = None
        data_limit: int | None = None
        if sys.platform.startswith("linux"):  # elsewhere (macOS) the kernel does not bound mmap by RLIMIT_DATA
            base = _data_bytes()
            data_limit = _within(resource.RLIMIT_DATA, base + memory_limit + slack)
            resource.setrlimit(resource.RLIMIT_DATA, (data_limit, data_limit))
        if cpu_seconds > 0:
            used = resource.getrusage(resource.RUSAGE_SELF)
            soft = _within(resource.RLIMIT_CPU, math.ceil(used.ru_utime + used.ru_stime + cpu_seconds))
            resource.setrlimit(resource.RLIMIT_CPU, (soft, _within(resource.RLIMIT_CPU, soft + 2)))
    except (OSError, ValueError) as exc:
        _send({"ready": False, "error": f"{type(exc).__name__}: {exc}"})
        os._exit(EXIT_SETUP)
    _send({"ready": True, "pid": os.getpid(), "data_base": base, "data_limit": data_limit})

    inbox: asyncio.Queue[bytes] = asyncio.Queue()

    def read_stdin() -> None:
        for line in sys.stdin.buffer:
            loop.call_soon_threadsafe(inbox.put_nowait, line)
        os._exit(0)  # the server closed the pipe (or died): nothing may outlive it

    threading.Thread(target=read_stdin, daemon=True).start()
    running: dict[int, asyncio.Task[None]] = {}

    async def evaluate(rid: int, code: str, before: asyncio.Task[None] | None) -> None:
        reply: dict[str, Any]
        if before is not None:  # one evaluation at a time, in order (a cancelled one ends first)
            try:
                await before
            except asyncio.CancelledError:
                me = asyncio.current_task()
                if me is not None and me.cancelling():  # this one was cancelled while it waited: never run
                    running.pop(rid, None)
                    _send({"id": rid, "ok": False, "kind": "cancelled", "hard": False})
                    return
            except Exception:
                pass
        try:
            value = await mr.eval_cancelable(code)
            if not isinstance(value, (str, int, float, bool, type(None))):
                value = None
            reply = {"ok": True, "v": value}
        except asyncio.CancelledError:
            reply = {"ok": False, "kind": "cancelled"}
        except JSOOMException:
            reply = {"ok": False, "kind": "memory"}
        except JSEvalException as exc:
            kind = "memory" if mr.was_hard_memory_limit_reached() else "js"
            reply = {"ok": False, "kind": kind, "error": type(exc).__name__}
        except MemoryError:
            os._exit(EXIT_MEMORY)
        except Exception as exc:
            reply = {"ok": False, "kind": "engine", "error": type(exc).__name__}
        reply["id"] = rid
        reply["hard"] = mr.was_hard_memory_limit_reached()
        running.pop(rid, None)
        _send(reply)

    last: asyncio.Task[None] | None = None
    while True:
        line = await inbox.get()
        try:
            msg = json.loads(line)
        except (ValueError, MemoryError):
            continue
        if not isinstance(msg, dict) or not isinstance(msg.get("id"), int):
            continue
        if msg.get("op") == "eval" and isinstance(msg.get("code"), str):
            last = loop.create_task(evaluate(msg["id"], msg["code"], last))
            running[msg["id"]] = last
        elif msg.get("op") == "cancel" and (task := running.get(msg["id"])) is not None:
            task.cancel()


if __name__ == "__main__":
    main()
