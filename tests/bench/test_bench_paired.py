"""bench.common.paired_difference: the statistic bench_proxy's before/after verdicts rest on."""

from __future__ import annotations

import random

from bench.common import paired_difference


def test_a_shift_paired_by_round_is_found_under_drift_that_hides_it_in_the_medians() -> None:
    rng = random.Random(7)
    drift = [rng.uniform(0.0, 2e-3) for _ in range(600)]  # the machine: ±1 ms from round to round
    b = [4e-3 + d + rng.gauss(0, 5e-5) for d in drift]
    a = [x + 1e-4 + rng.gauss(0, 5e-5) for x in b]  # 0.1 ms slower in every round
    p = paired_difference(a, b)
    assert p.verdict == "slower" and p.low > 0 and abs(p.median - 1e-4) < 3e-5
    assert paired_difference(b, a).verdict == "faster"


def test_no_difference_is_level_about_nineteen_times_in_twenty() -> None:
    """The interval's coverage: 400 runs without a difference, each of 300 rounds, deterministic seeds."""
    level = 0
    for seed in range(400):
        rng = random.Random(seed)
        b = [rng.uniform(3e-3, 6e-3) for _ in range(300)]
        a = [x + rng.gauss(0, 2e-4) for x in b]
        p = paired_difference(a, b)
        assert p.low <= p.median <= p.high and p.n == 300
        level += p.verdict == "level"
    assert 0.92 <= level / 400 <= 0.99


def test_few_pairs_give_the_widest_interval_and_none_give_nan() -> None:
    p = paired_difference([1.0, 2.0, 3.0], [0.5, 2.5, 2.0])
    assert (p.low, p.high) == (-0.5, 1.0) and p.verdict == "level"
    assert paired_difference([], []).n == 0


def test_a_group_of_columns_is_only_variants_never_a_baseline_with_the_same_first_letter() -> None:
    from bench.bench_proxy import _column

    times = {"bare": [1.0, 1.0], "bare-stream": [1.0, 1.0], "b1": [3.0, 5.0], "b2": [5.0, 7.0], "ctproxy": [9.0, 9.0]}
    assert _column(times, "b*") == [4.0, 6.0]
    assert _column(times, "c*") is None and _column(times, "b1") == [3.0, 5.0]


def test_a_pair_splits_at_the_hyphen_that_leaves_a_column_on_each_side() -> None:
    import pytest

    from bench.bench_proxy import FIXED_COLUMNS, STORE_PG, split_pair

    labels = {*FIXED_COLUMNS, STORE_PG, "pg-before", "h1", "h2"}
    assert split_pair(f"{STORE_PG}-pg-before", labels) == (STORE_PG, "pg-before")
    assert split_pair("pass-through-ctproxy", labels) == ("pass-through", "ctproxy")
    assert split_pair("h*-bare-stream", labels) == ("h*", "bare-stream")
    for bad in ("ctproxy-nothing", "ctproxy", "b*-ctproxy"):  # unknown column, no hyphen, a group of no variant
        with pytest.raises(SystemExit, match="the columns:"):
            split_pair(bad, labels)
    with pytest.raises(SystemExit, match="one way only"):  # "a-b | c" and "a | b-c" both name two columns
        split_pair("a-b-c", {"a", "a-b", "b-c", "c"})
