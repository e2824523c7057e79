"""The proxy's Prometheus metrics, one typed object per process (`proxy_metrics()`).

Names follow the Prometheus conventions (`ctproxy_` prefix, `_total` counters, `_seconds` histograms,
base units). Labels are closed sets or bounded names (route kinds, status codes, strategies), never ids,
paths or anything a client chooses freely, so the series count stays small.

Who counts what: the request log stage (`addons/requestlog.py`) observes every request; the stages that
compact, roll a window over, recover an overflow or run a bridged round call the matching method here
(`compaction`, `rollover`, `overflow_recovery`, `bridged_round`) — they never touch the collectors.
The registry is the process's own (not prometheus_client's global one): a test or a second runtime in
one process gets fresh numbers, and nothing registered by a library leaks in.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

# Seconds. Latency of an LLM request runs from milliseconds (a refused body) to minutes (a long stream).
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
TTFB_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

ROUTES = ("responses", "compact", "other")  # the `route` label: what the request was, by path


def route_label(path: str) -> str:
    """`responses` (POST …/responses), `compact` (…/responses/compact), `other`: a closed set."""
    bare = path.split("?", 1)[0].rstrip("/")
    if bare.endswith("/responses/compact"):
        return "compact"
    if bare.endswith("/responses"):
        return "responses"
    return "other"


def status_label(status: int | None) -> str:
    return str(status) if status is not None and 100 <= status <= 599 else "error"


@dataclass(frozen=True, slots=True)
class Observed:
    """One finished request, as the metrics need it (the request log stage builds it)."""

    route: str
    method: str
    status: int | None  # None: no answer (the upstream failed or the client left)
    seconds: float
    ttfb_seconds: float | None
    bytes_in: int
    bytes_out: int | None


_METHODS = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"})


class _RequestStats:
    """The request path's numbers as plain counters and bucket arrays, turned into metric families only when
    scraped (a prometheus_client Collector). An increment of a labelled prometheus_client metric costs
    microseconds (label validation, a lock per value, `labels()` on each call); a request updates seven
    values, so they are kept here for a fraction of that and exposed through the same library."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests: dict[tuple[str, str, str], int] = {}
        self.errors: dict[tuple[str, str], int] = {}
        self.bytes: dict[tuple[str, str], int] = {}
        self.latency: dict[str, list[float]] = {}  # route -> [count per bucket..., +Inf, sum]
        self.ttfb: dict[str, list[float]] = {}

    @staticmethod
    def _observe(table: dict[str, list[float]], key: str, value: float, buckets: tuple[float, ...]) -> None:
        row = table.get(key)
        if row is None:
            row = table[key] = [0.0] * (len(buckets) + 2)
        row[bisect.bisect_left(buckets, value)] += 1  # the first bucket whose bound is >= value
        row[-1] += value

    def observe(self, route: str, method: str, status: str, o: Observed) -> None:
        with self.lock:
            k = (route, method, status)
            self.requests[k] = self.requests.get(k, 0) + 1
            if o.status is None or o.status >= 400:
                e = (route, status)
                self.errors[e] = self.errors.get(e, 0) + 1
            self._observe(self.latency, route, max(o.seconds, 0.0), LATENCY_BUCKETS)
            if o.ttfb_seconds is not None:
                self._observe(self.ttfb, route, max(o.ttfb_seconds, 0.0), TTFB_BUCKETS)
            if o.bytes_in:
                b = (route, "in")
                self.bytes[b] = self.bytes.get(b, 0) + o.bytes_in
            if o.bytes_out:
                b = (route, "out")
                self.bytes[b] = self.bytes.get(b, 0) + o.bytes_out

    @staticmethod
    def _histogram(name: str, doc: str, table: dict[str, list[float]], bounds: tuple[float, ...]) -> Metric:
        fam = HistogramMetricFamily(name, doc, labels=["route"])
        for route, row in sorted(table.items()):
            cumulative, total = [], 0.0
            for bound, n in zip((*bounds, float("inf")), row[:-1], strict=True):
                total += n
                cumulative.append((floatToGoString(bound), total))
            fam.add_metric([route], cumulative, sum_value=row[-1])
        return fam

    def collect(self) -> Iterator[Metric]:
        with self.lock:
            requests, errors, nbytes = dict(self.requests), dict(self.errors), dict(self.bytes)
            latency = {k: list(v) for k, v in self.latency.items()}
            ttfb = {k: list(v) for k, v in self.ttfb.items()}
        fam = CounterMetricFamily("ctproxy_requests", "Requests through the proxy, by route, method and status",
                                  labels=["route", "method", "status"])
        for labels, n in sorted(requests.items()):
            fam.add_metric(list(labels), n)
        yield fam
        fam = CounterMetricFamily("ctproxy_request_errors", "Requests answered with a status >= 400 or not "
                                  "answered at all (status=error)", labels=["route", "status"])
        for labels, n in sorted(errors.items()):
            fam.add_metric(list(labels), n)
        yield fam
        yield self._histogram("ctproxy_request_duration_seconds", "From the request's first byte to the answer's "
                              "last byte", latency, LATENCY_BUCKETS)
        yield self._histogram("ctproxy_request_ttfb_seconds", "From the request's first byte to the upstream "
                              "answer's headers", ttfb, TTFB_BUCKETS)
        fam = CounterMetricFamily("ctproxy_request_bytes", "Body bytes: in = the client's request as received, "
                                  "out = the answer as sent", labels=["route", "direction"])
        for labels, n in sorted(nbytes.items()):
            fam.add_metric(list(labels), n)
        yield fam
        fam = CounterMetricFamily("ctproxy_store_round_trips", "Round trips to a PostgreSQL store, by the thread "
                                  "that waited (journal: the journal's writer, off the request path; request: "
                                  "every other)", labels=["path"])
        for path, n in sorted(store_round_trips().items()):
            fam.add_metric([path], n)
        yield fam


# Round trips to a PostgreSQL store, counted by the store's pooled connections (proxy/store/pgconn.py) by the
# thread that waited, and read by /metrics: kept here, on the bottom floor, so reading them imports no store.
_store_counts = {"request": 0, "journal": 0}
_store_count_lock = threading.Lock()
JOURNAL_THREAD = "ctproxy-journal"  # proxy/journal/writer.py's thread name


def count_store_round_trip() -> None:
    path = "journal" if threading.current_thread().name.startswith(JOURNAL_THREAD) else "request"
    with _store_count_lock:
        _store_counts[path] += 1


def store_round_trips() -> dict[str, int]:
    """The round trips this process made to a PostgreSQL store so far, by path (`request`, `journal`)."""
    with _store_count_lock:
        return dict(_store_counts)


class ProxyMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        self._stats = _RequestStats()
        r.register(self._stats)
        self._compactions = Counter("ctproxy_compactions", "Compactions made, by strategy (remote, fallback) "
                                    "and trigger (threshold, overflow)", ["strategy", "trigger"], registry=r)
        self._rollovers = Counter("ctproxy_rollovers", "New context windows opened, by strategy",
                                  ["strategy"], registry=r)
        self._recoveries = Counter("ctproxy_overflow_recoveries", "context_length_exceeded answers handled, by "
                                   "outcome (recovered, retry_failed, not_smaller, skipped, missed)",
                                   ["outcome"], registry=r)
        self._bridged = Counter("ctproxy_bridged_rounds", "Bridged tool rounds the proxy ran upstream, by outcome",
                                ["outcome"], registry=r)
        self._turn_tokens = Counter("ctproxy_bridged_turn_tokens", "Tokens bridged turns cost, every round summed "
                                    "(input, output, cached, total); each answer's own usage is its last round's",
                                    ["kind"], registry=r)
        self._prompt_tokens = Counter("ctproxy_prompt_tokens", "Input tokens of the answers to Responses creates, "
                                      "by kind (input, cached; prewarm: what pre-warming cost)", ["kind"], registry=r)
        self._cache_misses = Counter("ctproxy_prompt_cache_misses", "Answers inside a window whose cached tokens "
                                     "fell short of the previous answer's prompt (a broken prefix)", registry=r)
        self._reasoning_dropped = Counter("ctproxy_reasoning_dropped", "Reasoning items the upstream removed "
                                          "(input_transformations), by reason (prefix_mismatch, other)", ["reason"],
                                          registry=r)
        self._backlog = Gauge("ctproxy_journal_writer_backlog", "Journal writes waiting for the writer thread",
                              registry=r)
        self._backlog_of: Callable[[], int] | None = None
        self._backlog.set_function(self._read_backlog)

    # ---- the request path -------------------------------------------------------------------------

    def observe_request(self, o: Observed) -> None:
        route = o.route if o.route in ROUTES else "other"
        method = o.method if o.method in _METHODS else "OTHER"
        self._stats.observe(route, method, status_label(o.status), o)

    # ---- what other stages report -----------------------------------------------------------------

    def compaction(self, strategy: str, trigger: str) -> None:
        self._compactions.labels(_short(strategy), _short(trigger)).inc()

    def rollover(self, strategy: str) -> None:
        self._rollovers.labels(_short(strategy)).inc()

    def overflow_recovery(self, outcome: str) -> None:
        self._recoveries.labels(_short(outcome)).inc()

    def bridged_round(self, outcome: str = "ok") -> None:
        self._bridged.labels(_short(outcome)).inc()

    def turn_tokens(self, usage: Mapping[str, Any]) -> None:
        """A bridged turn's summed usage (what it cost)."""
        details = usage.get("input_tokens_details")
        found = {"input": usage.get("input_tokens"), "output": usage.get("output_tokens"),
                 "total": usage.get("total_tokens"),
                 "cached": details.get("cached_tokens") if isinstance(details, Mapping) else None}
        for kind, n in found.items():
            if isinstance(n, int) and not isinstance(n, bool) and n > 0:
                self._turn_tokens.labels(kind).inc(n)

    def prompt_cache(self, input_tokens: int, cached_tokens: int, miss: bool, dropped: int, prefix_mismatch: int,
                     prewarm: bool) -> None:
        """One answer's prompt-cache figures (proxy/windows/cache_stats.py)."""
        if prewarm:
            self._prompt_tokens.labels("prewarm").inc(max(0, input_tokens))
        else:
            self._prompt_tokens.labels("input").inc(max(0, input_tokens))
            self._prompt_tokens.labels("cached").inc(max(0, cached_tokens))
        if miss:
            self._cache_misses.inc()
        if prefix_mismatch:
            self._reasoning_dropped.labels("prefix_mismatch").inc(prefix_mismatch)
        if dropped > prefix_mismatch:
            self._reasoning_dropped.labels("other").inc(dropped - prefix_mismatch)

    def watch_journal_backlog(self, read: Callable[[], int] | None) -> None:
        """`read()` is called at scrape time (it must be cheap and thread-safe)."""
        self._backlog_of = read

    def _read_backlog(self) -> float:
        read = self._backlog_of
        if read is None:
            return 0.0
        try:
            return float(read())
        except Exception:  # a closing journal must not break a scrape
            return 0.0

    def render(self) -> bytes:
        """The Prometheus text exposition format (version 0.0.4)."""
        return generate_latest(self.registry)


def _short(value: str) -> str:
    """A label value from a stage: an identifier-like word, else `other` (labels are not free text)."""
    v = str(value)
    return v if 0 < len(v) <= 40 and v.replace("_", "").replace("-", "").isalnum() else "other"


_lock = threading.Lock()
_current: ProxyMetrics | None = None


def proxy_metrics() -> ProxyMetrics:
    """The process's metrics (made on first use)."""
    global _current
    m = _current
    if m is None:
        with _lock:
            if _current is None:
                _current = ProxyMetrics()
            m = _current
    return m


def reset() -> ProxyMetrics:
    """Fresh numbers (tests)."""
    global _current
    with _lock:
        _current = ProxyMetrics()
        return _current
