"""Benchmarks: each `bench_<name>.py` prints ratios against baselines measured in the same run.

`python -m bench` (or `make bench`) runs them all; `bench/common.py` holds the shared helpers.
"""
