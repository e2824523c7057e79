"""What the proxy process tells the tool server: its recent requests and its metrics, on loopback.

The proxy and the tool server are two processes (launcher.py); the dashboard and `/metrics` live on the
tool server. So the proxy keeps the last `FEED_SIZE` request records in memory (`RequestFeed`) and serves
them, with its Prometheus registry, on a loopback port of its own (`TelemetryServer`, chosen by the OS,
handed to the tool server as `--proxy-telemetry URL`). The tool server pulls: `/metrics` on scrape,
`/requests?after=ID&wait=S` as a long poll it relays to the dashboard's SSE stream.

The same rules as the tool server: a loopback Host only (DNS rebinding), no browser Origin, the state
directory's bearer token. It is a stdlib WSGI server on its own threads: nothing of it runs on the
proxy's event loop, and the request path only appends a record under a lock.

A record holds categories, counts, ids and timings only: never a header, a query string, a prompt, a
tool argument or a result.
"""

from __future__ import annotations

import hmac
import socketserver
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import orjson
from prometheus_client.utils import floatToGoString

from proxy.metrics import ProxyMetrics

FEED_SIZE = 500
MAX_WAIT_SECONDS = 25.0
# The bodies behind the on-demand diff (the client's request and what the chain forwarded): references the flow
# held anyway, kept a little longer, for small bodies only and within a total.
DIFF_BODY_MAX = 1024 * 1024
DIFF_TOTAL_MAX = 16 * 1024 * 1024
DIFF_MAX_LINES = 3000


@dataclass(slots=True)
class RequestRecord:
    """One request as the log line, the metrics and the dashboard see it."""

    id: int
    at: float  # when the request arrived (epoch seconds)
    method: str
    path: str  # without the query string
    route: str  # proxy.metrics.route_label
    status: int | None  # None: no answer (error says why)
    ms: float
    ttfb_ms: float | None
    bytes_in: int
    bytes_out: int | None
    stream: bool  # the answer was an SSE stream
    model: str | None = None
    session: str | None = None
    task: str | None = None
    agent: str | None = None
    stages: list[str] = field(default_factory=list)  # what the chain did: web_search, compaction:remote, …
    error: str | None = None  # a category (e.g. upstream_unreachable), never a message
    diff: bool = False  # the bodies are kept: `/requests/{id}/diff` shows what the chain changed
    transport: str = "http"  # "ws": a create (or the upgrade) of the Responses WebSocket mode
    worker: int | None = None  # `ctproxy up --workers N`: which worker served it (proxy/workerid.py)


@dataclass(slots=True)
class SeenRequest:
    """What a record is made of, taken from the flow when its answer is final (its state is released right
    after): references and numbers only, made into a `RequestRecord` later (addons/requestlog.py). Here, not in
    the addon: mitmproxy loads a `-s` script without registering it in `sys.modules`, where `dataclasses`
    looks up a class's module."""

    method: str
    path: str
    start: float
    end: float
    ttfb_ms: float | None
    status: int | None
    error: str | None
    ctype: str
    stream: Any  # the response's stream callable (its byte counter), or None
    resp_raw: int | None  # len of the buffered answer
    content_length: str
    sent: int
    model: Any
    identity: tuple[str | None, str | None, str | None]
    stages: list[str]
    compacted: tuple[str, str] | None  # (strategy, trigger) when this request caused a compaction
    bodies: Bodies | None = None
    transport: str | None = None  # FlowState.transport


@dataclass(slots=True, frozen=True)
class Bodies:
    client: bytes  # the request as the client sent it
    forwarded: bytes  # as the chain forwarded it (the same object when nothing changed it)
    encoding: str  # content-encoding of both

    @property
    def size(self) -> int:
        return len(self.client) + (0 if self.forwarded is self.client else len(self.forwarded))


class RequestFeed:
    """The last FEED_SIZE records, with a long poll for new ones. Thread-safe; `publish` is cheap."""

    def __init__(self, size: int = FEED_SIZE):
        self._records: deque[RequestRecord] = deque(maxlen=size)
        self._cond = threading.Condition()
        self._next = 1
        self._bodies: dict[int, Bodies] = {}  # oldest first
        self._body_bytes = 0

    def next_id(self) -> int:
        with self._cond:
            n = self._next
            self._next += 1
            return n

    def publish(self, record: RequestRecord, bodies: Bodies | None = None) -> None:
        with self._cond:
            if bodies is not None and bodies.size <= DIFF_BODY_MAX * 2:
                self._bodies[record.id] = bodies
                self._body_bytes += bodies.size
                record.diff = True
                while self._body_bytes > DIFF_TOTAL_MAX or len(self._bodies) > len(self._records) + 1:
                    old = self._bodies.pop(next(iter(self._bodies)))
                    self._body_bytes -= old.size
            self._records.append(record)
            self._cond.notify_all()

    def bodies(self, record_id: int) -> Bodies | None:
        with self._cond:
            return self._bodies.get(record_id)

    def diff_json(self, record_id: int) -> bytes | None:
        """`/requests/{id}/diff`'s answer, or None when the bodies are no longer kept."""
        bodies = self.bodies(record_id)
        return None if bodies is None else orjson.dumps({"id": record_id, "lines": body_diff(bodies)})

    def since(self, after: int = 0, wait: float = 0.0, limit: int = FEED_SIZE) -> list[RequestRecord]:
        """Records with an id above `after`, oldest first; waits up to `wait` seconds for one."""
        deadline = time.monotonic() + max(0.0, min(wait, MAX_WAIT_SECONDS))
        with self._cond:
            while True:
                found = [r for r in self._records if r.id > after]
                remaining = deadline - time.monotonic()
                if found or remaining <= 0:
                    return found[-limit:]
                self._cond.wait(remaining)


_feed: RequestFeed | None = None
_feed_lock = threading.Lock()


def request_feed() -> RequestFeed:
    global _feed
    if _feed is None:
        with _feed_lock:
            if _feed is None:
                _feed = RequestFeed()
    return _feed


def records_json(records: list[RequestRecord]) -> bytes:
    return orjson.dumps({"object": "list", "data": records})


def _pretty(raw: bytes, encoding: str) -> list[str]:
    from mitmproxy.net import encoding as codecs

    try:
        data = codecs.decode(raw, encoding) if encoding else raw
        return orjson.dumps(orjson.loads(data), option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode().splitlines()
    except (ValueError, orjson.JSONDecodeError):
        return [f"<{len(raw)} bytes, not JSON>"]


def body_diff(b: Bodies) -> list[str]:
    """What the chain changed in the body, as `ctproxy replay` shows it (a unified diff of the pretty JSON)."""
    import difflib

    if b.forwarded is b.client or b.forwarded == b.client:
        return []
    lines = list(difflib.unified_diff(_pretty(b.client, b.encoding), _pretty(b.forwarded, b.encoding),
                                      "client", "forwarded", lineterm="", n=2))
    return lines if len(lines) <= DIFF_MAX_LINES else [*lines[:DIFF_MAX_LINES], f"… {len(lines) - DIFF_MAX_LINES} more"]


# ---- the loopback server ------------------------------------------------------------------------------

_LOOPBACK = ("127.0.0.1", "localhost", "[::1]", "::1")


def _host_ok(host: str, port: int) -> bool:
    value = host.strip().lower()
    if value.startswith("["):
        name, _, rest = value.partition("]")
        name, port_part = name + "]", rest[1:] if rest.startswith(":") else ""
    else:
        name, _, port_part = value.partition(":")
    return name in _LOOPBACK and port_part == str(port)


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # no access log
        pass


class _ThreadingServer(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a long poll never keeps the process from stopping
    allow_reuse_address = True


class TelemetryServer:
    """`GET /metrics` (Prometheus text), `GET /requests?after=ID&wait=S` (JSON), bearer token required."""

    def __init__(self, token: str, metrics: ProxyMetrics | AggregateMetrics, feed: RequestFeed,
                 host: str = "127.0.0.1"):
        self._expected = f"Bearer {token}".encode()
        self.metrics = metrics
        self.feed = feed
        self.host = host
        self._server: _ThreadingServer | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> TelemetryServer:
        self._server = make_server(self.host, 0, self._app, server_class=_ThreadingServer,
                                   handler_class=_QuietHandler)
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.5},
                                        name="ctproxy-telemetry", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def _app(self, environ: dict[str, Any], start_response: Any) -> list[bytes]:
        def answer(status: str, body: bytes, ctype: str = "application/json") -> list[bytes]:
            start_response(status, [("Content-Type", ctype), ("Content-Length", str(len(body))),
                                    ("Cache-Control", "no-store")])
            return [body]

        def error(status: str, code: str, message: str) -> list[bytes]:
            return answer(status, orjson.dumps({"error": {"code": code, "message": message}}))

        if not _host_ok(environ.get("HTTP_HOST", ""), self.port):
            return error("403 Forbidden", "forbidden_host", "Host header is not this server's loopback address")
        if "HTTP_ORIGIN" in environ:
            return error("403 Forbidden", "forbidden_origin", "browser origins are refused")
        if not hmac.compare_digest(environ.get("HTTP_AUTHORIZATION", "").encode(), self._expected):
            return error("401 Unauthorized", "unauthorized", "missing or wrong bearer token (see `ctproxy token`)")
        if environ.get("REQUEST_METHOD") != "GET":
            return error("405 Method Not Allowed", "method_not_allowed", "only GET")
        path = environ.get("PATH_INFO", "")
        if path == "/metrics":
            return answer("200 OK", self.metrics.render(), "text/plain; version=0.0.4; charset=utf-8")
        if path.startswith("/requests/") and path.endswith("/diff"):
            try:
                record_id = int(path.split("/")[2])
            except ValueError:
                return error("404 Not Found", "not_found", "no such request")
            found = self.feed.diff_json(record_id)
            if found is None:
                return error("404 Not Found", "not_kept", "the bodies of this request are no longer kept")
            return answer("200 OK", found)
        if path == "/requests":
            q = parse_qs(environ.get("QUERY_STRING", ""))
            try:
                after = int(q.get("after", ["0"])[0])
                wait = float(q.get("wait", ["0"])[0])
                limit = max(1, min(int(q.get("limit", [str(FEED_SIZE)])[0]), FEED_SIZE))
            except ValueError:
                return error("400 Bad Request", "invalid_query", "after, wait and limit are numbers")
            return answer("200 OK", records_json(self.feed.since(after, wait, limit)))
        return error("404 Not Found", "not_found", "GET /metrics or /requests")


# ---- `ctproxy up --workers N`: the workers' telemetry as one ---------------------------------------------


def _get(url: str, token: str, timeout: float) -> bytes | None:
    import urllib.error
    import urllib.request

    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # loopback, our own workers
            return resp.read() if resp.status == 200 else None
    except (urllib.error.URLError, OSError, TimeoutError, ValueError):
        return None


def _label_value(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def sum_metrics(texts: list[bytes]) -> bytes:
    """Prometheus text expositions of several processes as one: samples with the same name and labels are
    added (counters, histogram buckets, sums and counts, gauges); a `_created` sample keeps the earliest."""
    from prometheus_client.parser import text_string_to_metric_families

    families: dict[str, tuple[str, str]] = {}  # name -> (type, help), first seen order
    samples: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
    for text in texts:
        for fam in text_string_to_metric_families(text.decode("utf-8", "replace")):
            families.setdefault(fam.name, (fam.type, fam.documentation))
            table = samples.setdefault(fam.name, {})
            for sample in fam.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                if key not in table:
                    table[key] = sample.value
                elif sample.name.endswith("_created"):
                    table[key] = min(table[key], sample.value)
                else:
                    table[key] += sample.value
    out: list[str] = []
    for name, (typ, doc) in families.items():
        if not samples[name]:
            continue
        out.append(f"# HELP {name} {doc.replace(chr(92), chr(92) * 2).replace(chr(10), chr(92) + 'n')}")
        out.append(f"# TYPE {name} {typ}")
        for (sname, labels), value in samples[name].items():
            lab = ",".join(f'{k}="{_label_value(v)}"' for k, v in labels)
            out.append(f"{sname}{{{lab}}} {floatToGoString(value)}" if lab else f"{sname} {floatToGoString(value)}")
    return ("\n".join(out) + "\n").encode() if out else b""


class AggregateMetrics:
    """What `/metrics` shows with several workers: each worker's metrics (its loopback telemetry) summed,
    plus `ctproxy_proxy_workers` (how many answered this scrape)."""

    def __init__(self, token: str, sources: Callable[[], list[str]]):
        self.token = token
        self.sources = sources

    def render(self) -> bytes:
        texts = [t for url in self.sources() if (t := _get(url + "/metrics", self.token, 5.0)) is not None]
        head = (b"# HELP ctproxy_proxy_workers Proxy worker processes whose metrics this scrape summed\n"
                b"# TYPE ctproxy_proxy_workers gauge\n" + f"ctproxy_proxy_workers {len(texts)}\n".encode())
        return head + sum_metrics(texts)


class AggregateFeed(RequestFeed):
    """The workers' request records as one feed: a thread per worker long-polls its `/requests` and publishes
    each record here under a new id (the worker's own id kept for the body diff, asked of that worker)."""

    def __init__(self, token: str, size: int = FEED_SIZE):
        super().__init__(size)
        self.token = token
        self._origin: dict[int, tuple[int, int]] = {}  # our id -> (worker index, its id)
        self._urls: dict[int, str] = {}  # worker index -> its telemetry URL (a restarted worker gets a new one)
        self._threads: dict[int, threading.Thread] = {}
        self._stopped = threading.Event()

    def set_worker(self, index: int, url: str | None) -> None:
        with self._cond:
            if url is None:
                self._urls.pop(index, None)
            else:
                self._urls[index] = url
        if url is not None and index not in self._threads:
            t = threading.Thread(target=self._poll, args=(index,), name=f"ctproxy-feed-{index}", daemon=True)
            self._threads[index] = t
            t.start()

    def urls(self) -> list[str]:
        with self._cond:
            return [self._urls[i] for i in sorted(self._urls)]

    def stop(self) -> None:
        self._stopped.set()

    def _poll(self, index: int) -> None:
        url, after = None, 0
        while not self._stopped.is_set():
            with self._cond:
                now = self._urls.get(index)
            if now is None:
                self._stopped.wait(0.5)
                continue
            if now != url:
                url, after = now, 0
            raw = _get(f"{url}/requests?after={after}&wait=10", self.token, 20.0)
            if raw is None:
                self._stopped.wait(0.5)
                continue
            try:
                data = orjson.loads(raw).get("data") or []
            except (orjson.JSONDecodeError, AttributeError):
                data = []
            for row in data:
                if not isinstance(row, dict) or not isinstance(row.get("id"), int):
                    continue
                after = max(after, row["id"])
                fields = {k: v for k, v in row.items() if k in RequestRecord.__dataclass_fields__}
                kept = bool(fields.pop("diff", False))
                own = self.next_id()
                record = RequestRecord(**{**fields, "id": own, "worker": row.get("worker") or index})
                record.diff = kept
                with self._cond:
                    self._origin[own] = (index, row["id"])
                    while len(self._origin) > 4 * FEED_SIZE:
                        self._origin.pop(next(iter(self._origin)))
                self.publish(record)

    def diff_json(self, record_id: int) -> bytes | None:
        with self._cond:
            found = self._origin.get(record_id)
            url = self._urls.get(found[0]) if found is not None else None
        if found is None or url is None:
            return None
        raw = _get(f"{url}/requests/{found[1]}/diff", self.token, 30.0)
        if raw is None:
            return None
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return None
        return orjson.dumps({"id": record_id, "lines": body.get("lines", [])})
