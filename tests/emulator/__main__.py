"""Run the emulator standalone, e.g. for benchmarks in another process:

    python -m tests.emulator --port 8900 --deltas 200      (from the repository root)
    python -m tests.emulator --script replies.json --port 0

`--script FILE` queues the replies of a JSON script (tests/emulator/script.py says the format); once they
are used up the default echo answers.

`--json-deltas N` gives non-streaming answers their own delta count (a benchmark's JSON answers need
not pay for rendering the hundreds of events its streams carry).

Prints `listening on http://HOST:PORT` once ready; stops on SIGINT/SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys

from .app import Emulator, echo_reply
from .recording import ReceivedRequest
from .script import ScriptError


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.emulator", description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--deltas", type=int, default=3, help="output_text.delta events per default answer")
    parser.add_argument("--json-deltas", type=int, default=None,
                        help="text deltas of a non-streaming default answer (default: --deltas)")
    parser.add_argument(
        "--validate-requests", action="store_true", help="answer 400 when a body violates CreateResponse"
    )
    parser.add_argument("--script", default=None, help="a JSON file of scripted replies (tests/emulator/script.py)")
    parser.add_argument(
        "--no-check-input-items", action="store_true",
        help="skip the real API's input rules (call/output pairs, reasoning followers, item references)",
    )
    parser.add_argument(
        "--check-previous-response-id", action="store_true",
        help="answer 400 for a previous_response_id the emulator did not store (off: bench clients may chain "
        "ids the bounded store forgot)",
    )
    parser.add_argument(
        "--tool-loop", type=int, default=0, metavar="N",
        help="to a request offering a `lookup` tool: call it (call ids loop_1…loop_N) until the input carries "
        "the output of loop_N, then the echo answer (bench/bench_ws.py's tool loop)",
    )
    parser.add_argument(
        "--burst-latency", type=float, default=0.0, metavar="S",
        help="with --tool-loop: a request whose input mentions `burst` waits S seconds before its answer (a model's "
        "time to first event; bench/bench_ws.py's lanes)",
    )
    parser.add_argument(
        "--max-recorded", type=int, default=100, help="keep at most this many requests in memory (bodies included)"
    )
    return parser.parse_args(argv)


async def serve(args: argparse.Namespace) -> None:
    emu = Emulator(
        default_deltas=args.deltas,
        validate_requests=args.validate_requests,
        max_recorded=args.max_recorded,
        check_previous_response_id=args.check_previous_response_id,
        check_input_items=not args.no_check_input_items,
    )
    if args.script:
        try:
            emu.load_script(args.script)
        except ScriptError as exc:
            print(f"python -m tests.emulator: {exc}", file=sys.stderr, flush=True)
            raise SystemExit(2) from None
    if args.json_deltas is not None:
        def reply(rec: ReceivedRequest) -> object:
            streams = isinstance(rec.json, dict) and rec.json.get("stream") is True
            return echo_reply(rec, args.deltas if streams else args.json_deltas)

        emu.set_default(reply)
    if args.tool_loop:
        emu.set_default(tool_loop(args.tool_loop, args.deltas, args.burst_latency))
    await emu.start(args.host, args.port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    print(f"listening on {emu.url}", flush=True)
    try:
        await stop.wait()
    finally:
        await emu.close()


def tool_loop(calls: int, deltas: int, burst_latency: float = 0.0):
    """The default reply of a tool loop: the next `lookup` call after the newest `loop_K` output (and a request
    mentioning `burst` answered after `burst_latency` seconds)."""
    import dataclasses

    from .replies import FunctionCall

    def reply(rec: ReceivedRequest) -> object:
        body = rec.json if isinstance(rec.json, dict) else {}
        if burst_latency and b"burst" in rec.body:
            return dataclasses.replace(echo_reply(rec, deltas), latency=burst_latency)
        if not any(isinstance(t, dict) and t.get("name") == "lookup" for t in body.get("tools") or []):
            return echo_reply(rec, deltas)  # not the loop's request
        done = 0
        for item in body.get("input") or []:
            if isinstance(item, dict) and item.get("type") == "function_call_output":
                call = str(item.get("call_id", ""))
                if call.startswith("loop_") and call[5:].isdigit():
                    done = max(done, int(call[5:]))
        if done >= calls:
            return echo_reply(rec, deltas)
        return FunctionCall("lookup", {"key": f"k{done + 1}"}, call_id=f"loop_{done + 1}")

    return reply


def main(argv: list[str] | None = None) -> int:
    asyncio.run(serve(parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
