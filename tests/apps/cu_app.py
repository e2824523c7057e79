#!/usr/bin/python3
"""The Computer Use test app: an entry, a button, a label and a scrollable list (GTK 3).

Runs under the system python3 with python3-gi (a separate process from the tool server). The title
comes from argv[1] so a test can start two distinct apps. It prints "ready" once the window is mapped.
"""

import sys

import gi

gi.require_version("Gtk", "3.0")
from gi.repository import GLib, Gtk  # noqa: E402

TITLE = sys.argv[1] if len(sys.argv) > 1 else "CU Test App"


def main() -> None:
    GLib.set_prgname(TITLE.lower().replace(" ", "-"))
    GLib.set_application_name(TITLE)
    win = Gtk.Window(title=TITLE)
    win.set_default_size(420, 360)
    win.move(40, 40)
    box = Gtk.Box(orientation=Gtk.Orientation.VERTICAL, spacing=6)
    entry = Gtk.Entry()
    entry.set_name("entry")
    label = Gtk.Label(label="not clicked")
    counter = {"n": 0}

    def clicked(_button: Gtk.Button) -> None:
        counter["n"] += 1
        label.set_text(f"clicked {counter['n']}")

    button = Gtk.Button(label="Press me")
    button.connect("clicked", clicked)
    store = Gtk.ListStore(str)
    for i in range(200):
        store.append([f"row {i:03d}"])
    view = Gtk.TreeView(model=store)
    view.append_column(Gtk.TreeViewColumn("Rows", Gtk.CellRendererText(), text=0))
    scroller = Gtk.ScrolledWindow()
    scroller.set_vexpand(True)
    scroller.add(view)
    for widget in (entry, button, label, scroller):
        box.pack_start(widget, widget is scroller, widget is scroller, 0)
    win.add(box)
    win.connect("destroy", Gtk.main_quit)

    def mapped(*_a: object) -> None:
        print("ready", flush=True)

    win.connect("map-event", mapped)
    win.show_all()
    Gtk.main()


if __name__ == "__main__":
    main()
