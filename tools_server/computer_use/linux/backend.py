"""Computer Use on a Linux X11 desktop: the accessibility tree from AT-SPI, the pixels from X, the input
through xdotool. Approval is asked by the family before anything here runs (this backend has no
elicitation of its own).

Coordinates the model sees (element bounds, click/scroll x,y) are pixels relative to the app's last
screenshot, which is the union of its visible top-level windows on the screen.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field

from proxy.config import ComputerUseConfig
from tools_server.computer_use.errors import ComputerUseError
from tools_server.computer_use.linux import x11, xdotool
from tools_server.computer_use.linux.atspi import (
    ACTION,
    ACTIVE,
    COMPONENT,
    DEFUNCT,
    FOCUSED,
    SHOWING,
    STATE_NAMES,
    TEXT,
    Atspi,
    AtspiError,
    Ref,
)
from tools_server.computer_use.linux.desktop import Desktop, DesktopError, start_desktop
from tools_server.computer_use.model import ActionCall, AppInfo, AppState, Button, Direction, Screenshot, Target

MAX_ELEMENTS = 400
MAX_DEPTH = 40
OFF_SCREEN = -(2**30)
TEXT_LIMIT = 400
WINDOW_ROLES = {"frame", "dialog", "window", "alert", "file chooser"}


@dataclass
class Element:
    index: int
    ref: Ref
    depth: int
    role: str
    name: str
    states: set[int]
    bounds: tuple[int, int, int, int] | None  # on the screen
    actions: list[str]
    text: str | None
    text_length: int = 0


@dataclass
class Snapshot:
    app: AppInfo
    origin: tuple[int, int, int, int]  # the screenshot's box on the screen
    elements: list[Element] = field(default_factory=list)


@dataclass(frozen=True)
class _Live:
    info: AppInfo
    ref: Ref


class LinuxBackend:
    name = "linux"
    asks_approval_itself = False

    def __init__(self, config: ComputerUseConfig):
        self.config = config
        self._desktop: Desktop | None = None
        self._atspi: Atspi | None = None
        self._snapshots: dict[str, Snapshot] = {}  # by app ident (pid:N)
        self._resolved: _Live | None = None
        self._seen: dict[str, AppInfo] = {}  # every app resolved once, to tell "closed" from "never existed"

    # -- the environment ---------------------------------------------------------------------------------
    @property
    def desktop(self) -> Desktop | None:
        return self._desktop

    async def _env(self, tool: str) -> tuple[str | None, str | None]:
        display = self.config.display or os.environ.get("DISPLAY")
        bus = self.config.dbus_address or os.environ.get("DBUS_SESSION_BUS_ADDRESS")
        if self._desktop is not None:
            return self._desktop.display, self._desktop.bus_address
        if not display and self.config.start_xvfb:
            try:
                self._desktop = await start_desktop(self.config.xvfb_screen)
            except DesktopError as exc:
                raise ComputerUseError(tool, "backend-unavailable", f"cannot start the private desktop: {exc}") from exc
            return self._desktop.display, self._desktop.bus_address
        if not display:
            raise ComputerUseError(tool, "backend-unavailable",
                                   "no X display: set computer_use.display (or DISPLAY), or computer_use.start_xvfb")
        return display, bus

    async def _bus(self, tool: str) -> Atspi:
        _, bus = await self._env(tool)
        if self._atspi is None or not self._atspi.connected:
            try:
                self._atspi = await Atspi.connect(bus)
            except Exception as exc:
                raise ComputerUseError(tool, "backend-unavailable",
                                       f"the AT-SPI accessibility bus is not reachable ({type(exc).__name__}); "
                                       "is at-spi2-core running in this desktop session?") from exc
        return self._atspi

    async def _display(self, tool: str) -> str | None:
        return (await self._env(tool))[0]

    async def close(self) -> None:
        if self._atspi is not None:
            self._atspi.close()
            self._atspi = None
        if self._desktop is not None:
            await self._desktop.close()
            self._desktop = None

    # -- apps ----------------------------------------------------------------------------------------------
    async def _apps(self, tool: str) -> list[_Live]:
        bus = await self._bus(tool)
        display = await self._display(tool)
        try:
            refs = await bus.applications()
        except AtspiError as exc:
            raise ComputerUseError(tool, "backend-unavailable", f"the AT-SPI registry did not answer ({exc})") from exc
        windows = await asyncio.to_thread(x11.top_windows, display)
        _focus_wid, focus_pid = await asyncio.to_thread(x11.focused_pid, display)

        async def one(ref: Ref) -> _Live | None:
            try:
                name, pid = await asyncio.gather(bus.name(ref), bus.pid_of(ref.bus))
            except AtspiError:
                return None  # gone while listing
            titles = tuple(w.title for w in windows if pid is not None and w.pid == pid)
            if not titles:
                return None  # no window on this display: nothing to look at or click
            info = AppInfo(name=name.strip() or f"pid:{pid}", pid=pid, windows=titles,
                           active=focus_pid is not None and focus_pid == pid, ident=f"pid:{pid}")
            return _Live(info, ref)

        return [a for a in await asyncio.gather(*(one(r) for r in refs)) if a is not None]

    async def list_apps(self, call: ActionCall) -> list[AppInfo]:
        return [a.info for a in await self._apps(call.tool)]

    async def _live(self, call: ActionCall) -> _Live:
        wanted = call.app.strip()
        apps = await self._apps(call.tool)
        if wanted.startswith("pid:"):
            hits = [a for a in apps if a.info.ident == wanted]
        else:
            hits = [a for a in apps if a.info.name == wanted]
            if not hits:
                hits = [a for a in apps if wanted in a.info.windows]
        if len(hits) > 1:
            idents = ", ".join(f"{a.info.ident} ({a.info.windows[0] if a.info.windows else a.info.name})"
                               for a in hits)
            raise ComputerUseError(call.tool, "ambiguous-app",
                                   f"{len(hits)} running apps match '{wanted[:80]}'; name one of them: {idents}")
        if not hits:
            seen = self._seen.get(wanted)
            if seen is not None:
                self._snapshots.pop(seen.ident, None)
                raise ComputerUseError(call.tool, "app-closed",
                                       f"the app '{wanted[:80]}' ({seen.ident}) is no longer running or has no "
                                       "window; call computer_use_list_apps to see what is open")
            names = ", ".join(sorted({a.info.name for a in apps})) or "none"
            raise ComputerUseError(call.tool, "app-not-found",
                                   f"no running app is called '{wanted[:80]}'; running apps: {names}")
        self._seen[wanted] = hits[0].info
        return hits[0]

    async def resolve(self, call: ActionCall) -> AppInfo:
        live = await self._live(call)
        self._resolved = live  # the family resolves right before it dispatches: no second listing
        return live.info

    # -- state ------------------------------------------------------------------------------------------
    async def _walk(self, bus: Atspi, root: Ref) -> list[Element]:
        elements: list[Element] = []
        parents: dict[Ref, Ref] = {}
        frontier: list[tuple[Ref, int]] = [(c, 0) for c in await bus.children(root)]
        # breadth first, one level at a time, the calls of a level in parallel: the bus is the slow part
        while frontier and len(elements) < MAX_ELEMENTS:
            nodes = await asyncio.gather(*(self._node(bus, ref, depth) for ref, depth in frontier))
            nxt: list[tuple[Ref, int]] = []
            for node, children in nodes:
                if node is None or len(elements) >= MAX_ELEMENTS:
                    continue
                elements.append(node)
                if node.depth < MAX_DEPTH:
                    for c in children:
                        parents[c] = node.ref
                        nxt.append((c, node.depth + 1))
            frontier = nxt
        return _in_tree_order(elements, parents)

    async def _node(self, bus: Atspi, ref: Ref, depth: int) -> tuple[Element | None, list[Ref]]:
        try:
            states = await bus.states(ref)
            if SHOWING not in states or DEFUNCT in states:
                return None, []
            role, name, ifaces, children = await asyncio.gather(bus.role(ref), bus.name(ref), bus.interfaces(ref),
                                                                bus.children(ref))
            bounds, actions, (text, length) = await asyncio.gather(
                bus.extents(ref) if COMPONENT in ifaces else _none(),
                bus.actions(ref) if ACTION in ifaces else _empty(),
                bus.text(ref, TEXT_LIMIT) if TEXT in ifaces else _no_text())
            if bounds is not None and min(bounds[0], bounds[1]) <= OFF_SCREEN:
                return None, []  # GTK keeps scrolled-out rows "showing" but places them at INT_MIN
        except AtspiError:
            return None, []
        return Element(0, ref, depth, role, name, states, bounds, actions, text, length), children

    async def get_app_state(self, call: ActionCall, app: AppInfo) -> AppState:
        live = self._resolved if self._resolved is not None and self._resolved.info == app else await self._live(call)
        self._resolved = None
        bus = await self._bus(call.tool)
        display = await self._display(call.tool)
        try:
            elements = await self._walk(bus, live.ref)
        except AtspiError as exc:
            raise _closed(call, app) from exc
        screen_w, screen_h = await asyncio.to_thread(x11.screen_size, display)
        frames = [e.bounds for e in elements if e.role in WINDOW_ROLES and e.bounds and e.depth == 0]
        box = _clip(_union(frames), screen_w, screen_h) if frames else None
        if box is None:
            raise ComputerUseError(call.tool, "no-window", f"the app '{app.name}' has no visible window on the screen")
        png, width, height = await asyncio.to_thread(x11.grab_png, display, box)
        snap = Snapshot(app, box, elements)
        self._snapshots[app.ident] = snap
        text = _render(snap, width, height)
        focused = next((e.index for e in elements if FOCUSED in e.states), None)
        return AppState(app=app.name, text=text, screenshot=Screenshot(png, "image/png", width, height),
                        details={"app": app.name, "pid": app.pid, "elements": len(elements),
                                 "focused_element": focused, "screenshot": {"width": width, "height": height},
                                 "tree": [_brief(e, box) for e in elements],
                                 "active": any(ACTIVE in e.states for e in elements if e.depth == 0)})

    # -- actions ----------------------------------------------------------------------------------------
    def _snapshot(self, call: ActionCall, app: AppInfo) -> Snapshot:
        snap = self._snapshots.get(app.ident)
        if snap is None:
            raise ComputerUseError(call.tool, "state-required",
                                   f"call computer_use_get_app_state for '{app.name}' first: element indexes and "
                                   "coordinates refer to its last state")
        return snap

    async def _point(self, call: ActionCall, app: AppInfo, target: Target) -> tuple[tuple[int, int], Element | None]:
        """The screen point an action lands on, checked against the app's last screenshot."""
        snap = self._snapshot(call, app)
        ox, oy, ow, oh = snap.origin
        if target.element_index is not None:
            if not 0 <= target.element_index < len(snap.elements):
                raise ComputerUseError(call.tool, "bad-target",
                                       f"element_index {target.element_index} is not in the last state "
                                       f"(0..{len(snap.elements) - 1})")
            el = snap.elements[target.element_index]
            bus = await self._bus(call.tool)
            try:
                states = await bus.states(el.ref)
                bounds = await bus.extents(el.ref)
            except AtspiError as exc:
                raise ComputerUseError(call.tool, "stale-element",
                                       f"element [{el.index}] is gone; call computer_use_get_app_state again") from exc
            if DEFUNCT in states or SHOWING not in states:
                raise ComputerUseError(call.tool, "stale-element",
                                       f"element [{el.index}] is no longer shown; call computer_use_get_app_state "
                                       "again")
            x, y, w, h = bounds
            if w <= 0 or h <= 0:
                raise ComputerUseError(call.tool, "bad-target", f"element [{el.index}] has no area to click")
            cx, cy = x + w // 2, y + h // 2
            if not (ox <= cx < ox + ow and oy <= cy < oy + oh):
                raise ComputerUseError(call.tool, "bad-target",
                                       f"element [{el.index}] lies outside the app's window; scroll it into view")
            return (cx, cy), el
        if target.x is None or target.y is None:
            return (ox + ow // 2, oy + oh // 2), None
        if not (0 <= target.x < ow and 0 <= target.y < oh):
            raise ComputerUseError(call.tool, "bad-target",
                                   f"({target.x:g}, {target.y:g}) is outside the last screenshot ({ow}x{oh})")
        return (ox + int(target.x), oy + int(target.y)), None

    async def _front(self, call: ActionCall, app: AppInfo, point: tuple[int, int]) -> str | None:
        """Raise and focus the app's window under `point`, and check it has the focus: clicks never land
        in another app."""
        display = await self._display(call.tool)
        windows = [w for w in await asyncio.to_thread(x11.top_windows, display) if w.pid == app.pid]
        under = [w for w in windows if w.x <= point[0] < w.x + w.width and w.y <= point[1] < w.y + w.height]
        if not under:
            raise ComputerUseError(call.tool, "bad-target", "the point is not on any window of the app")
        with_wm = await asyncio.to_thread(x11.wm_name_of, display) is not None
        await xdotool.activate(display, under[-1].wid, with_wm)
        await self._require_focus(call, app)
        return display

    async def _require_focus(self, call: ActionCall, app: AppInfo) -> None:
        display = await self._display(call.tool)
        _, pid = await asyncio.to_thread(x11.focused_pid, display)
        if pid != app.pid:
            raise ComputerUseError(call.tool, "focus-lost",
                                   f"the keyboard focus is not in '{app.name}' (it is in "
                                   f"{'pid ' + str(pid) if pid else 'no app'}); nothing was typed. Click into the "
                                   "app first, then call this again")

    async def click(self, call: ActionCall, app: AppInfo, target: Target, button: Button, count: int) -> str:
        point, el = await self._point(call, app, target)
        display = await self._front(call, app, point)
        snap = self._snapshot(call, app)
        here = await asyncio.to_thread(x11.pointer, display) == point
        await xdotool.click(display, point[0], point[1], button, count, already_there=here)
        rel = (point[0] - snap.origin[0], point[1] - snap.origin[1])
        what = f"element [{el.index}] {el.role} {_q(el.name)}" if el else "the screenshot point"
        return f"Clicked {what} at ({rel[0]}, {rel[1]}) with the {button} button x{count}."

    async def type_text(self, call: ActionCall, app: AppInfo, text: str) -> str:
        await self._require_focus(call, app)
        await xdotool.type_text(await self._display(call.tool), text)
        return f"Typed {len(text)} characters into '{app.name}'."

    async def press_key(self, call: ActionCall, app: AppInfo, key: str) -> str:
        if not x11.valid_key(key):
            raise ComputerUseError(call.tool, "bad-key",
                                   f"'{key[:40]}' is not an xdotool-style key (e.g. Return, BackSpace, ctrl+a, "
                                   "shift+Tab, F5)")
        await self._require_focus(call, app)
        await xdotool.key(await self._display(call.tool), key)
        return f"Pressed {key} in '{app.name}'."

    async def scroll(self, call: ActionCall, app: AppInfo, target: Target, direction: Direction, amount: int) -> str:
        point, el = await self._point(call, app, target)
        display = await self._front(call, app, point)
        here = await asyncio.to_thread(x11.pointer, display) == point
        await xdotool.scroll(display, point[0], point[1], direction, amount, already_there=here)
        what = f"element [{el.index}] {el.role}" if el else "the window"
        return f"Scrolled {direction} by {amount} over {what}."


async def _none() -> None:
    return None


async def _empty() -> list[str]:
    return []


async def _no_text() -> tuple[None, int]:
    return None, 0


def _closed(call: ActionCall, app: AppInfo) -> ComputerUseError:
    return ComputerUseError(call.tool, "app-closed", f"the app '{app.name}' ({app.ident}) closed while being read")


def _q(text: str) -> str:
    return '"' + text.replace("\n", " ")[:80] + '"' if text else '""'


def _union(boxes: list[tuple[int, int, int, int]]) -> tuple[int, int, int, int]:
    left = min(b[0] for b in boxes)
    top = min(b[1] for b in boxes)
    right = max(b[0] + b[2] for b in boxes)
    bottom = max(b[1] + b[3] for b in boxes)
    return left, top, right - left, bottom - top


def _clip(box: tuple[int, int, int, int], sw: int, sh: int) -> tuple[int, int, int, int] | None:
    left, top = max(0, box[0]), max(0, box[1])
    right, bottom = min(sw, box[0] + box[2]), min(sh, box[1] + box[3])
    return (left, top, right - left, bottom - top) if right > left and bottom > top else None


def _in_tree_order(elements: list[Element], parents: dict[Ref, Ref]) -> list[Element]:
    children: dict[Ref | None, list[Element]] = {}
    for e in elements:
        children.setdefault(parents.get(e.ref), []).append(e)
    out: list[Element] = []
    stack = list(reversed(children.get(None, [])))
    while stack:
        e = stack.pop()
        e.index = len(out)
        out.append(e)
        stack.extend(reversed(children.get(e.ref, [])))
    return out


def _brief(e: Element, origin: tuple[int, int, int, int]) -> dict:
    """One element as REST/MCP structured data (the same facts as its line in the text)."""
    bounds = [e.bounds[0] - origin[0], e.bounds[1] - origin[1], e.bounds[2], e.bounds[3]] if e.bounds else None
    return {"index": e.index, "depth": e.depth, "role": e.role, "name": e.name, "bounds": bounds,
            "states": sorted(STATE_NAMES[s] for s in e.states if s in STATE_NAMES), "actions": e.actions,
            "text": e.text}


def _render(snap: Snapshot, width: int, height: int) -> str:
    ox, oy = snap.origin[0], snap.origin[1]
    lines = [f"App: {snap.app.name} ({snap.app.ident}); windows: {', '.join(_q(t) for t in snap.app.windows)}",
             f"Screenshot: {width}x{height} px of the app's windows. Element bounds and click/scroll x,y are "
             "pixels in this screenshot; prefer element_index.",
             "Elements ([index] role \"name\" {states} @x,y wxh actions: ... text: \"...\"):"]
    for e in snap.elements:
        parts = [f"{'  ' * e.depth}[{e.index}] {e.role} {_q(e.name)}"]
        states = sorted(STATE_NAMES[s] for s in e.states if s in STATE_NAMES and s not in (SHOWING, 30, 24, 8))
        if states:
            parts.append("{" + ",".join(states) + "}")
        if e.bounds:
            x, y, w, h = e.bounds
            parts.append(f"@{x - ox},{y - oy} {w}x{h}")
        if e.actions:
            parts.append("actions: " + ",".join(e.actions))
        if e.text is not None and e.text != e.name:
            more = f" (+{e.text_length - len(e.text)} more)" if e.text_length > len(e.text) else ""
            parts.append(f"text: {_q(e.text)}{more}")
        lines.append(" ".join(parts))
    if len(snap.elements) >= MAX_ELEMENTS:
        lines.append(f"(the tree was cut at {MAX_ELEMENTS} elements)")
    return "\n".join(lines)
