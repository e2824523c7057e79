"""`python -m tools_server --listen 127.0.0.1:8788 --state-dir DIR [--config FILE] [--workspace DIR]`."""

from __future__ import annotations

import argparse
import asyncio
import logging
from pathlib import Path

from proxy.config import config_path_from_env, load_config, with_overrides
from proxy.state import StateDir
from tools_server.server import serve


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tools_server", description="ctproxy's tool server")
    parser.add_argument("--listen", default="127.0.0.1:8788")
    parser.add_argument("--state-dir", type=Path)
    parser.add_argument("--config", type=Path)
    parser.add_argument("--workspace", type=Path, default=None,
                        help="the directory apply_patch and exec_command may change (no default: without it "
                        "they refuse; x-ctp-cwd may then pick a directory inside it)")
    parser.add_argument("--enable", action="append", default=[])
    parser.add_argument("--disable", action="append", default=[])
    parser.add_argument("--debug", action="store_true")
    parser.add_argument("--parent-pid", type=int, help="stop when this process is gone (set by `ctproxy up`)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    state = StateDir.open(args.state_dir)
    config = with_overrides(load_config(config_path_from_env(state.root, args.config)), args.enable, args.disable)
    host, _, port = args.listen.rpartition(":")
    asyncio.run(serve(config, state, args.workspace, host.strip("[]") or "127.0.0.1", int(port),
                      parent_pid=args.parent_pid))


if __name__ == "__main__":
    main()
