"""A headless desktop for the Computer Use tests: Xvfb, a session bus, the AT-SPI bus, openbox, and the
GTK test app (tests/apps/cu_app.py, run by the system python3 with python3-gi). Every process is this
fixture's own child, stopped by its PID."""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

APP = Path(__file__).resolve().parent.parent / "apps" / "cu_app.py"
SYSTEM_PYTHON = "/usr/bin/python3"
LAUNCHERS = ("/usr/libexec/at-spi-bus-launcher", "/usr/lib/at-spi2-core/at-spi-bus-launcher")


def missing() -> str | None:
    """Why the desktop cannot be started here (what to install), or None."""
    need = [pkg for exe, pkg in (("Xvfb", "xvfb"), ("xdotool", "xdotool"), ("dbus-daemon", "dbus"),
                                 ("dbus-send", "dbus"), ("openbox", "openbox")) if shutil.which(exe) is None]
    if not any(os.access(p, os.X_OK) for p in LAUNCHERS):
        need.append("at-spi2-core")
    probe = "import gi; gi.require_version('Gtk', '3.0'); from gi.repository import Gtk"
    gtk = subprocess.run([SYSTEM_PYTHON, "-c", probe], capture_output=True) if os.path.exists(SYSTEM_PYTHON) else None
    if gtk is None or gtk.returncode != 0:
        need.append("python3-gi gir1.2-gtk-3.0")
    if not need:
        return None
    from tests.support.optional import setup_skipped

    said = setup_skipped("desktop")
    return (f"the desktop test packages are not installed: {', '.join(need)}"
            + (f" (the set-up skipped {said})" if said else " (scripts/bootstrap.sh installs them)"))


def _line(proc: subprocess.Popen, timeout: float, what: str, fd: int | None = None) -> str:
    stream = proc.stdout if fd is None else None
    readable = [fd if fd is not None else stream]
    deadline = time.monotonic() + timeout
    buf = b""
    while time.monotonic() < deadline:
        r, _, _ = select.select(readable, [], [], 0.5)
        if r:
            chunk = os.read(fd if fd is not None else stream.fileno(), 4096)  # type: ignore[union-attr]
            if not chunk:
                break
            buf += chunk
            if b"\n" in buf:
                return buf.split(b"\n", 1)[0].decode().strip()
        if proc.poll() is not None and not r:
            break
    raise RuntimeError(f"{what} did not start (within {timeout:g} s)")


class Desktop:
    def __init__(self, screen: str = "1280x800x24", window_manager: bool = True):
        self.procs: list[subprocess.Popen] = []
        self.apps: list[subprocess.Popen] = []
        rfd, wfd = os.pipe()
        xvfb = subprocess.Popen(["Xvfb", "-displayfd", str(wfd), "-screen", "0", screen, "-nolisten", "tcp",
                                 "-noreset"], pass_fds=(wfd,), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
        os.close(wfd)
        self.procs.append(xvfb)
        try:
            self.display = ":" + _line(xvfb, 30, "Xvfb", fd=rfd)
        finally:
            os.close(rfd)
        bus = subprocess.Popen(["dbus-daemon", "--session", "--nofork", "--print-address=1"],
                               stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                               start_new_session=True, env={**os.environ, "DISPLAY": self.display})
        self.procs.append(bus)
        self.bus = _line(bus, 30, "dbus-daemon")
        launcher = next(p for p in LAUNCHERS if os.access(p, os.X_OK))
        self.procs.append(subprocess.Popen([launcher, "--launch-immediately"], env=self.env(),
                                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                           stderr=subprocess.DEVNULL, start_new_session=True))
        self._wait_a11y_bus()
        self.window_manager = window_manager
        if window_manager:
            self.procs.append(subprocess.Popen(["openbox", "--sm-disable"], env=self.env(), stdin=subprocess.DEVNULL,
                                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                               start_new_session=True))
            self._wait_wm()

    def _wait_a11y_bus(self, timeout: float = 30) -> None:
        """Until our launcher owns org.a11y.Bus (asked without activating it): an app's GetAddress before that
        would make the session bus start a second, stray launcher (the race the product's desktop.py waits out)."""
        deadline = time.monotonic() + timeout
        ask = ["dbus-send", f"--bus={self.bus}", "--print-reply=literal", "--dest=org.freedesktop.DBus",
               "/org/freedesktop/DBus", "org.freedesktop.DBus.NameHasOwner", "string:org.a11y.Bus"]
        while time.monotonic() < deadline:
            if subprocess.run(ask, capture_output=True, text=True).stdout.split()[-1:] == ["true"]:
                return
            time.sleep(0.05)
        raise RuntimeError("at-spi-bus-launcher did not claim org.a11y.Bus")

    def _wait_wm(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            probe = subprocess.run([sys.executable, "-c", "import sys\nfrom Xlib import display\n"
                                    "d = display.Display(sys.argv[1])\n"
                                    "sys.exit(0 if d.screen().root.get_full_property("
                                    "d.intern_atom('_NET_SUPPORTING_WM_CHECK'), 0) else 1)", self.display],
                                   capture_output=True)
            if probe.returncode == 0:
                return
            time.sleep(0.1)
        raise RuntimeError("openbox did not take the screen")

    def env(self) -> dict[str, str]:
        return {**os.environ, "DISPLAY": self.display, "DBUS_SESSION_BUS_ADDRESS": self.bus, "NO_AT_BRIDGE": "0"}

    def overrides(self, **more: object) -> dict[str, object]:
        """The tool-server config that drives this desktop."""
        return {"computer_use.enabled": True, "computer_use.display": self.display,
                "computer_use.dbus_address": self.bus, **more}

    def start_app(self, title: str) -> subprocess.Popen:
        """Start the GTK test app titled `title` (its AT-SPI name: the title lower-cased, spaces as dashes) and
        wait until its window is mapped."""
        proc = subprocess.Popen([SYSTEM_PYTHON, str(APP), title], env=self.env(), stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True)
        self.apps.append(proc)
        if _line(proc, 60, f"the test app {title!r}") != "ready":
            raise RuntimeError("the test app did not say ready")
        return proc

    @staticmethod
    def stop(proc: subprocess.Popen) -> None:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()

    def close(self) -> None:
        for proc in [*self.apps, *reversed(self.procs)]:
            self.stop(proc)
        self.apps.clear()
        self.procs.clear()
