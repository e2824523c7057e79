"""Input through xdotool (XTest events on the display), one subprocess per step."""

from __future__ import annotations

import asyncio
import os
import shutil

from proxy.errors import CtproxyError

BUTTONS = {"left": 1, "middle": 2, "right": 3}
WHEEL = {"up": 4, "down": 5, "left": 6, "right": 7}


class XdotoolError(CtproxyError):
    pass


def path() -> str | None:
    return shutil.which("xdotool")


async def run(display: str | None, *args: str, timeout: float = 30.0) -> str:
    exe = path()
    if exe is None:
        raise XdotoolError("xdotool is not installed")
    env = dict(os.environ)
    if display:
        env["DISPLAY"] = display
    proc = await asyncio.create_subprocess_exec(exe, *args, env=env, stdin=asyncio.subprocess.DEVNULL,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except (TimeoutError, asyncio.CancelledError):
        proc.kill()
        await proc.wait()
        raise
    if proc.returncode != 0:
        # the first line only: xdotool's messages name windows and keys, never typed text
        first = err.decode(errors="replace").strip().splitlines()[:1]
        raise XdotoolError(f"xdotool {args[0]} failed ({first[0][:200] if first else proc.returncode})")
    return out.decode(errors="replace")


def _move(x: int, y: int, already_there: bool) -> list[str]:
    # `mousemove --sync` waits for the pointer to move, which never happens when it is already there
    # (xdotool then sits out ~15 s); the XTest events are ordered either way
    return ["mousemove", str(x), str(y)] if already_there else ["mousemove", "--sync", str(x), str(y)]


async def click(display: str | None, x: int, y: int, button: str, count: int, already_there: bool = False) -> None:
    await run(display, *_move(x, y, already_there), "click", "--repeat", str(count), "--delay", "80",
              str(BUTTONS[button]))


async def scroll(display: str | None, x: int, y: int, direction: str, amount: int,
                 already_there: bool = False) -> None:
    await run(display, *_move(x, y, already_there), "click", "--repeat", str(amount), "--delay", "30",
              str(WHEEL[direction]))


async def type_text(display: str | None, text: str) -> None:
    # 50-character chunks keep one xdotool run short (the Anthropic demo does the same)
    for i in range(0, len(text), 50):
        await run(display, "type", "--delay", "12", "--", text[i:i + 50])


async def key(display: str | None, chord: str) -> None:
    await run(display, "key", "--delay", "12", "--", chord)


async def activate(display: str | None, wid: int, with_wm: bool) -> None:
    """Raise and focus a window: `windowactivate` needs a window manager; without one, focus and raise."""
    if with_wm:
        await run(display, "windowactivate", "--sync", str(wid))
    else:
        await run(display, "windowraise", str(wid))
        await run(display, "windowfocus", "--sync", str(wid))
