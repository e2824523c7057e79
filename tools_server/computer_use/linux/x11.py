"""The X side: top-level windows and their PIDs, which one has the focus, and screenshots.

Synchronous (python-xlib, mss): callers run these in a thread. Each call opens its own connection, so a
display that went away fails one call, not the backend.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import mss
from PIL import Image
from Xlib import XK, X
from Xlib import display as xdisplay
from Xlib.error import XError

from proxy.errors import CtproxyError


class X11Error(CtproxyError):
    """The display cannot be opened or answered with an error."""


@dataclass(frozen=True)
class Window:
    wid: int
    pid: int | None
    title: str
    x: int
    y: int
    width: int
    height: int


@contextmanager
def opened(name: str | None) -> Iterator[xdisplay.Display]:
    try:
        d = xdisplay.Display(name)
    except Exception as exc:  # Xlib raises DisplayConnectionError, DisplayNameError, OSError...
        raise X11Error(f"cannot open X display {name or '$DISPLAY'}: {type(exc).__name__}") from exc
    try:
        yield d
    finally:
        d.close()


def _prop(d: xdisplay.Display, win, name: str, kind=X.AnyPropertyType):  # type: ignore[no-untyped-def]
    try:
        value = win.get_full_property(d.intern_atom(name), kind)
    except XError:
        return None
    return value.value if value is not None else None


def wm_name(d: xdisplay.Display) -> str | None:
    """The EWMH window manager's name, when one runs (`_NET_SUPPORTING_WM_CHECK`)."""
    root = d.screen().root
    check = _prop(d, root, "_NET_SUPPORTING_WM_CHECK")
    if not check:
        return None
    name = _prop(d, d.create_resource_object("window", int(check[0])), "_NET_WM_NAME")
    return (name.decode(errors="replace") if isinstance(name, bytes) else str(name or "")) or "unnamed"


def _title(d: xdisplay.Display, win) -> str:  # type: ignore[no-untyped-def]
    raw = _prop(d, win, "_NET_WM_NAME") or _prop(d, win, "WM_NAME") or b""
    return raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)


def _geometry(d: xdisplay.Display, win) -> tuple[int, int, int, int] | None:  # type: ignore[no-untyped-def]
    try:
        g = win.get_geometry()
        pos = win.translate_coords(d.screen().root, 0, 0)
        return -pos.x, -pos.y, g.width, g.height
    except XError:
        return None


def top_windows(name: str | None) -> list[Window]:
    """Client windows: `_NET_CLIENT_LIST` with a window manager, else the viewable children of the root."""
    with opened(name) as d:
        root = d.screen().root
        ids = _prop(d, root, "_NET_CLIENT_LIST")
        if ids:
            wins = [d.create_resource_object("window", int(i)) for i in ids]
        else:
            wins = []
            for w in root.query_tree().children:
                try:
                    if w.get_attributes().map_state == X.IsViewable:
                        wins.append(w)
                except XError:
                    continue
        out = []
        for w in wins:
            pid = _prop(d, w, "_NET_WM_PID")
            geo = _geometry(d, w)
            if geo is None:
                continue
            out.append(Window(w.id, int(pid[0]) if pid else None, _title(d, w), *geo))
        return out


def focused_pid(name: str | None) -> tuple[int | None, int | None]:
    """(window id, pid) of the window that has the keyboard: `_NET_ACTIVE_WINDOW` under a window manager,
    else the X input focus walked up to its top-level window."""
    with opened(name) as d:
        root = d.screen().root
        active = _prop(d, root, "_NET_ACTIVE_WINDOW") if wm_name(d) else None
        if active and int(active[0]):
            win = d.create_resource_object("window", int(active[0]))
        else:
            win = d.get_input_focus().focus
            if not hasattr(win, "id"):  # PointerRoot or None: nobody in particular has it
                return None, None
        # walk up until a window that carries a PID (the client's top level)
        for _ in range(16):
            pid = _prop(d, win, "_NET_WM_PID")
            if pid:
                return win.id, int(pid[0])
            try:
                tree = win.query_tree()
            except XError:
                return None, None
            if tree.parent == 0 or tree.parent.id == root.id:
                break
            win = tree.parent
        return win.id, None


def pointer(name: str | None) -> tuple[int, int]:
    with opened(name) as d:
        p = d.screen().root.query_pointer()
        return p.root_x, p.root_y


def screen_size(name: str | None) -> tuple[int, int]:
    with opened(name) as d:
        s = d.screen()
        return s.width_in_pixels, s.height_in_pixels


def grab_png(name: str | None, box: tuple[int, int, int, int] | None) -> tuple[bytes, int, int]:
    """A PNG of `box` (left, top, width, height on the screen), or of the whole screen."""
    with mss.MSS(display=name) as sct:
        mon = sct.monitors[0]
        if box is not None:
            mon = {"left": box[0], "top": box[1], "width": box[2], "height": box[3]}
        shot = sct.grab(mon)
    img = Image.frombytes("RGB", shot.size, shot.rgb)
    buf = io.BytesIO()
    img.save(buf, format="PNG", compress_level=1)  # speed over size: a UI screenshot compresses well anyway
    return buf.getvalue(), shot.size[0], shot.size[1]


MODIFIERS = {"ctrl", "control", "alt", "shift", "super", "meta", "hyper", "mod1", "mod4"}


def valid_key(spec: str) -> bool:
    """An xdotool-style chord: modifiers and one key joined by '+', each a known X keysym name."""
    parts = spec.split("+")
    if not spec or any(not p for p in parts):
        return False
    for p in parts[:-1]:
        if p.lower() not in MODIFIERS:
            return False
    last = parts[-1]
    return last.lower() in MODIFIERS or XK.string_to_keysym(last) != 0 or (len(last) == 1 and last.isprintable())


def wm_name_of(name: str | None) -> str | None:
    with opened(name) as d:
        return wm_name(d)
