"""A private headless desktop for a machine without one: Xvfb, a session bus, the AT-SPI bus, and an EWMH
window manager when one is installed (openbox, then xfwm4). Each process is ctproxy's own child, stopped
by its PID when the desktop is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import signal
import socket
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from proxy.errors import CtproxyError

AT_SPI_LAUNCHERS = ("/usr/libexec/at-spi-bus-launcher", "/usr/lib/at-spi2-core/at-spi-bus-launcher")
WINDOW_MANAGERS = (("openbox", ("--sm-disable",)), ("xfwm4", ("--compositor=off",)))


def at_spi_launcher() -> str | None:
    return next((p for p in AT_SPI_LAUNCHERS if os.access(p, os.X_OK)), None)


def missing_for_private_desktop() -> list[str]:
    """What `start_xvfb` needs that this machine lacks (Debian package names)."""
    need = []
    if shutil.which("Xvfb") is None:
        need.append("xvfb")
    if shutil.which("dbus-daemon") is None:
        need.append("dbus")
    if at_spi_launcher() is None:
        need.append("at-spi2-core")
    return need


class DesktopError(CtproxyError):
    pass


def write_xauthority(path: Path) -> None:
    """One MIT-MAGIC-COOKIE-1 for this host and any display number (libXau and python-xlib both match an
    entry with an empty display number), so only holders of the file can connect to the private Xvfb."""
    def field_(data: bytes) -> bytes:
        return len(data).to_bytes(2, "big") + data
    entry = (FAMILY_LOCAL.to_bytes(2, "big") + field_(socket.gethostname().encode()) + field_(b"")
             + field_(b"MIT-MAGIC-COOKIE-1") + field_(secrets.token_bytes(16)))
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(entry)


FAMILY_LOCAL = 256


@dataclass
class Desktop:
    display: str
    bus_address: str
    window_manager: str | None
    _procs: list[asyncio.subprocess.Process] = field(default_factory=list)
    xauthority: Path | None = None

    def env(self) -> dict[str, str]:
        """The environment an app needs to appear on this desktop (and in its accessibility tree)."""
        env = {**os.environ, "DISPLAY": self.display, "DBUS_SESSION_BUS_ADDRESS": self.bus_address,
               "NO_AT_BRIDGE": "0", "GTK_A11Y": "atspi"}
        if self.xauthority is not None:
            env["XAUTHORITY"] = str(self.xauthority)
        return env

    def published(self) -> dict[str, str]:
        """What other tools need to use this desktop (a shell starting an app on it): its display, X
        cookie and session bus; none of the rest of the environment."""
        env = {"DISPLAY": self.display, "DBUS_SESSION_BUS_ADDRESS": self.bus_address, "NO_AT_BRIDGE": "0",
               "GTK_A11Y": "atspi"}
        if self.xauthority is not None:
            env["XAUTHORITY"] = str(self.xauthority)
        return env

    async def close(self) -> None:
        for proc in reversed(self._procs):
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
                try:
                    await asyncio.wait_for(proc.wait(), 5)
                except TimeoutError:
                    with contextlib.suppress(ProcessLookupError):
                        proc.kill()
                    await proc.wait()
        self._procs.clear()
        if self.xauthority is not None:
            if os.environ.get("XAUTHORITY") == str(self.xauthority):
                del os.environ["XAUTHORITY"]
            shutil.rmtree(self.xauthority.parent, ignore_errors=True)


async def _read_line(stream: asyncio.StreamReader | None, what: str, timeout: float) -> str:
    assert stream is not None
    try:
        line = await asyncio.wait_for(stream.readline(), timeout)
    except TimeoutError as exc:
        raise DesktopError(f"{what} did not start within {timeout:g} s") from exc
    if not line:
        raise DesktopError(f"{what} exited while starting")
    return line.decode().strip()


# How long Xvfb, the session bus and the AT-SPI registry may take to answer: the wait ends as soon as they do
# (well under a second on an idle machine), so the bound costs nothing then. 30 s was once not enough on a 2-core
# machine running two test suites and valgrind beside it (the registry had not answered).
START_SECONDS = 120.0


async def start_desktop(screen: str = "1280x800x24", *, window_manager: bool = True,
                        timeout: float = START_SECONDS) -> Desktop:
    if need := missing_for_private_desktop():
        raise DesktopError(f"missing Debian packages: {', '.join(need)}")
    runtime = Path(os.environ.get("XDG_RUNTIME_DIR") or "/tmp")
    procs: list[asyncio.subprocess.Process] = []
    desktop = Desktop("", "", None, procs, Path(tempfile.mkdtemp(prefix="ctproxy-desktop-")) / "Xauthority")
    try:
        assert desktop.xauthority is not None
        write_xauthority(desktop.xauthority)
        rfd, wfd = os.pipe()
        try:
            xvfb = await asyncio.create_subprocess_exec(
                "Xvfb", "-displayfd", str(wfd), "-auth", str(desktop.xauthority), "-screen", "0", screen,
                "-nolisten", "tcp", "-noreset",
                pass_fds=(wfd,), stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL, start_new_session=True)
        finally:
            os.close(wfd)
        procs.append(xvfb)
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(rfd, "rb"))
        try:
            desktop.display = ":" + await _read_line(reader, "Xvfb", timeout)
        finally:
            transport.close()
        # what the session bus activates on demand must reach this display too (hence the cookie)
        bus = await asyncio.create_subprocess_exec(
            "dbus-daemon", "--session", "--nofork", "--print-address=1", stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL, start_new_session=True,
            env={**os.environ, "DISPLAY": desktop.display, "XAUTHORITY": str(desktop.xauthority)},
            cwd=str(runtime))
        procs.append(bus)
        desktop.bus_address = await _read_line(bus.stdout, "dbus-daemon", timeout)
        launcher = at_spi_launcher()
        assert launcher is not None
        procs.append(await asyncio.create_subprocess_exec(
            launcher, "--launch-immediately", env=desktop.env(), stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL, start_new_session=True))
        if window_manager:
            for exe, args in WINDOW_MANAGERS:
                if shutil.which(exe):
                    procs.append(await asyncio.create_subprocess_exec(
                        exe, *args, env=desktop.env(), stdin=asyncio.subprocess.DEVNULL,
                        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
                        start_new_session=True))
                    desktop.window_manager = exe
                    break
        # python-xlib, mss (libX11) and xdotool in this process find the cookie through XAUTHORITY; the
        # private desktop is only started when no display is configured, so nothing else here uses X
        os.environ["XAUTHORITY"] = str(desktop.xauthority)
        await _wait_ready(desktop, timeout)
        return desktop
    except BaseException:
        await desktop.close()
        raise


A11Y_BUS_NAME = "org.a11y.Bus"


async def _wait_for_owner(bus_address: str, name: str, deadline: float) -> None:
    """Until our own launcher owns `name`. Asked without activation on purpose: `org.a11y.Bus` is
    D-Bus-activatable, so a `GetAddress` sent before the launcher has claimed it starts a second launcher (outside
    this desktop's processes, so never stopped), the two race for the name, and when the stray one wins the
    registry it spawns cannot reach the display and dies: the desktop then never became ready (the test that
    failed about once in three loaded runs; a start/stop loop failed once in ≈50)."""
    from dbus_fast import Message, MessageType
    from dbus_fast.aio import MessageBus

    loop = asyncio.get_running_loop()
    session = await MessageBus(bus_address=bus_address).connect()
    try:
        while loop.time() < deadline:
            reply = await session.call(Message(
                destination="org.freedesktop.DBus", path="/org/freedesktop/DBus", interface="org.freedesktop.DBus",
                member="NameHasOwner", signature="s", body=[name]))
            if reply is not None and reply.message_type == MessageType.METHOD_RETURN and reply.body[0]:
                return
            await asyncio.sleep(0.05)
    finally:
        session.disconnect()
    raise DesktopError(f"{name} was not claimed on the private session bus in time (at-spi-bus-launcher)")


async def _wait_ready(desktop: Desktop, timeout: float) -> None:
    """The AT-SPI registry answers on its bus, and the window manager (if one was started) has claimed the
    screen. (The bus alone is not enough: on a loaded machine the registry daemon it launches may not answer
    yet, and the desktop's first `list_apps` got `org.freedesktop.DBus.Error.NoReply`.)"""
    from tools_server.computer_use.linux import x11
    from tools_server.computer_use.linux.atspi import Atspi

    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    last: Exception | None = None
    await _wait_for_owner(desktop.bus_address, A11Y_BUS_NAME, deadline)
    while loop.time() < deadline:
        try:
            client = await Atspi.connect(desktop.bus_address)
            try:
                await client.applications(timeout=max(0.5, min(5.0, deadline - loop.time())))
            finally:
                client.close()
            if desktop.window_manager is None or await asyncio.to_thread(
                    lambda: x11.wm_name_of(desktop.display)) is not None:
                return
        except Exception as exc:  # not up yet
            last = exc
        await asyncio.sleep(0.1)
    raise DesktopError(f"the private desktop did not become ready in {timeout:g} s "
                       f"({type(last).__name__ if last else 'window manager not up'})")
