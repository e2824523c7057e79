"""Computer Use on a headless Xvfb desktop: the median time of `computer_use_get_app_state` (accessibility
tree + screenshot) and of a `computer_use_click`, next to a bare screenshot grab of the same window measured
in the same run (mss + PNG encoding, what get_app_state's screenshot costs by itself).

The desktop (Xvfb, session bus, AT-SPI bus, openbox) and the GTK test app come from tests/support/desktop.py;
the calls go through the family's tools as a transport would (validation, lock, approval 'always').

    .venv/bin/python bench/bench_computer_use.py [--runs 31] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import print_table, ratio, summarize, write_result
from tests.support import desktop as desktop_support
from tests.support.toolserver import make_services
from tools_server.computer_use.family import ComputerUseFamily
from tools_server.computer_use.linux import x11
from tools_server.registry import CallContext

APP = "CU bench"


async def run(runs: int) -> dict:
    desk = desktop_support.Desktop()
    try:
        desk.start_app(APP)
        with tempfile.TemporaryDirectory() as tmp:
            services = make_services(Path(tmp), desk.overrides(**{"computer_use.approval_mode": "always"}))
            family = ComputerUseFamily(services)
            tools = {t.name: t for t in family.tools()}
            ctx = CallContext(services=services)

            async def call(name: str, **args: object) -> object:
                res = await tools[name].call(args, ctx)
                assert not res.is_error, res.text
                return res

            deadline = time.monotonic() + 60
            while True:  # the app's tree appears on the AT-SPI bus a little after its window
                listed = await tools["computer_use_list_apps"].call({}, ctx)
                if any(APP in a["windows"] for a in listed.details["apps"]) or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.2)
            first = await call("computer_use_get_app_state", app=APP)
            button = next(e for e in first.details["tree"] if e["role"] == "push button")
            box = family.backend._snapshots[next(iter(family.backend._snapshots))].origin
            state_s, click_s, grab_s = [], [], []
            for _ in range(runs):
                t = time.perf_counter()
                await asyncio.to_thread(x11.grab_png, desk.display, box)
                grab_s.append(time.perf_counter() - t)
                t = time.perf_counter()
                await call("computer_use_get_app_state", app=APP)
                state_s.append(time.perf_counter() - t)
                t = time.perf_counter()
                await call("computer_use_click", app=APP, element_index=button["index"])
                click_s.append(time.perf_counter() - t)
            elements = first.details["elements"]
            await family.close()
    finally:
        desk.close()
    grab, state, click = summarize(grab_s), summarize(state_s), summarize(click_s)
    rows = [["bare screenshot grab (mss + PNG)", f"{grab.median * 1000:.1f}", f"{grab.p99 * 1000:.1f}", "1.00"],
            ["get_app_state (tree + screenshot)", f"{state.median * 1000:.1f}", f"{state.p99 * 1000:.1f}",
             f"{ratio(state.median, grab.median):.2f}"],
            ["click (element index)", f"{click.median * 1000:.1f}", f"{click.p99 * 1000:.1f}",
             f"{ratio(click.median, grab.median):.2f}"]]
    print(f"Computer Use on Xvfb, {runs} runs each, window {box[2]}x{box[3]}, {elements} elements in the tree")
    print_table(["measure", "median ms", "p99 ms", "x grab"], rows)
    return {"runs": runs, "window": list(box[2:]), "elements": elements,
            "grab_ms": grab.median * 1000, "get_app_state_ms": state.median * 1000, "click_ms": click.median * 1000,
            "get_app_state_over_grab": ratio(state.median, grab.median)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=31)
    parser.add_argument("--quick", action="store_true", help="9 runs")
    args = parser.parse_args()
    if (why := desktop_support.missing()) is not None:
        print(f"skipped: {why}")
        return
    result = asyncio.run(run(9 if args.quick else args.runs))
    print(f"wrote {write_result('computer_use', result)}")


if __name__ == "__main__":
    main()
