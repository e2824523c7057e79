"""Loads bench/memprobe.py into a process started with this directory on PYTHONPATH and CTP_MEMPROBE set."""

import os

if os.environ.get("CTP_MEMPROBE"):
    from bench import memprobe

    memprobe.install()
