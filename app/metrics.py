"""Prometheus metrics, kept as plain counters in the process and turned into the text
format only when scraped.

prometheus-client's own Counter and Histogram take a lock and walk label dicts on every
observation; on the hot page that cost more than the page itself. Here an observation is
a dict lookup, a `bisect` and two additions (the event loop is one thread, so no lock),
and gauges (open streams, running turns, pool connections) are read from the objects that
already hold them, at scrape time only. `Collector.collect` renders the counters through
prometheus-client's metric families, so the exposition is the library's own.

`GET /metrics` is answered by `Service.__call__` in front of every middleware: never
rate-limited, never asks for a key. With `METRICS_PORT` it moves to a port of its own
(`serve_port`), and on the main port the path is FastAPI's, which has no such route (404). With `--workers N` each worker keeps its
own figures: a scrape of the main port reaches one of them (docs/operations.md, "Metrics").
"""

import asyncio
import bisect
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from starlette.types import Receive, Scope, Send

from app.errors import next_request_id, problem_response

log = logging.getLogger("app.metrics")

CONTENT_TYPE = b"text/plain; version=0.0.4; charset=utf-8"
# Seconds: from 0.5 ms (a cached page) to 10 s (a slow checkpoint under an outage).
LATENCY_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
# Seconds a turn runs: a scripted reply takes milliseconds, a model's minutes.
TURN_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


@dataclass(slots=True)
class Histogram:
    """Counts per bucket (not cumulative; the scrape accumulates them), sum and count."""

    bounds: tuple[float, ...]
    counts: list[int] = field(init=False)
    total: float = 0.0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value

    def buckets(self) -> list[tuple[str, float]]:
        out: list[tuple[str, float]] = []
        running = 0
        for bound, count in zip(self.bounds, self.counts, strict=False):
            running += count
            out.append((repr(bound), running))
        out.append(("+Inf", running + self.counts[-1]))
        return out


class Histograms:
    """One histogram per label values, created on first use."""

    __slots__ = ("bounds", "by_labels", "help", "labels", "name")

    def __init__(
        self, name: str, help: str, labels: tuple[str, ...], bounds: tuple[float, ...]
    ) -> None:
        self.name = name
        self.help = help
        self.labels = labels
        self.bounds = bounds
        self.by_labels: dict[tuple[str, ...], Histogram] = {}

    def observe(self, labels: tuple[str, ...], value: float) -> None:
        histogram = self.by_labels.get(labels)
        if histogram is None:
            histogram = self.by_labels[labels] = Histogram(self.bounds)
        histogram.observe(value)

    def family(self) -> Metric:
        family = HistogramMetricFamily(self.name, self.help, labels=self.labels)
        for labels, histogram in self.by_labels.items():
            family.add_metric(list(labels), histogram.buckets(), histogram.total)
        return family


class Counters:
    __slots__ = ("by_labels", "help", "labels", "name")

    def __init__(self, name: str, help: str, labels: tuple[str, ...] = ()) -> None:
        self.name = name
        self.help = help
        self.labels = labels
        self.by_labels: dict[tuple[str, ...], float] = {}

    def inc(self, labels: tuple[str, ...] = (), amount: float = 1.0) -> None:
        self.by_labels[labels] = self.by_labels.get(labels, 0.0) + amount

    def inc_by(self, amount: float) -> None:
        """`inc` of the unlabelled series, by `amount`."""
        self.inc((), amount)

    def family(self) -> Metric:
        family = CounterMetricFamily(self.name, self.help, labels=self.labels)
        for labels, value in self.by_labels.items():
            family.add_metric(list(labels), value)
        return family


# Label values -> value, read when scraped.
ReadValues = Callable[[], Iterable[tuple[tuple[str, ...], float]]]


@dataclass(slots=True)
class Reader:
    kind: type[GaugeMetricFamily] | type[CounterMetricFamily]
    name: str
    help: str
    labels: tuple[str, ...]
    read: ReadValues

    def family(self) -> Metric:
        family = self.kind(self.name, self.help, labels=self.labels)
        for labels, value in self.read():
            family.add_metric(list(labels), value)
        return family


class Metrics(Collector):
    """Every series the service exports. Observations are plain method calls; the
    modules that make them hold this object (None when metrics are disabled)."""

    def __init__(self) -> None:
        self.http = Histograms(
            "evermirror_http_request_duration_seconds",
            "Time from the request's arrival at the application to its response "
            "headers (for a stream: until it opened), by route template (within the "
            "API: `/v1` and `/api/v1` requests share their route's series)",
            ("route", "method", "status"),
            LATENCY_BUCKETS,
        )
        self.checkpoints = Histograms(
            "evermirror_checkpoint_commit_seconds",
            "Durable write transactions (checkpoints and other writes): time of the "
            "COMMIT (or of the ROLLBACK), by outcome",
            ("outcome",),
            LATENCY_BUCKETS,
        )
        self.turns = Histograms(
            "evermirror_turn_duration_seconds",
            "Turns this process ran to an end, by outcome",
            ("outcome",),
            TURN_BUCKETS,
        )
        self.fanout_lag = Histograms(
            "evermirror_fanout_delivery_lag_seconds",
            "From a text delta's publication (its ts, any process) to its frames "
            "being queued for this process's subscribers; one delta in 32",
            (),
            LATENCY_BUCKETS,
        )
        self.bus_lag = Histograms(
            "evermirror_bus_notification_lag_seconds",
            "From a text delta's publication (its ts, any process) to its arrival "
            "here; one delta in 32",
            ("kind",),
            LATENCY_BUCKETS,
        )
        self.bus_notifications = Counters(
            "evermirror_bus_notifications",
            "Bus items this process received, by kind",
            ("kind",),
        )
        self.feedback = Counters(
            "evermirror_feedback",
            "Feedback this process stored on messages, by rating (`none`: a comment"
            " alone, or feedback removed)",
            ("rating",),
        )
        self.sessions_purged = Counters(
            "evermirror_sessions_purged",
            "Sessions this process's purge deleted (expires_at passed, or no activity"
            " for SESSION_RETENTION_DAYS)",
        )
        self._requests: dict[tuple[str, str, int], Histogram] = {}
        # Read from the objects that hold them when a scrape comes (`read`).
        self.readers: list[Reader] = []
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    # ---- observations -----------------------------------------------------------------

    def request(self, route: str, method: str, status: int, seconds: float) -> None:
        # Looked up by the caller's own values (an int status, no label strings made):
        # this runs on every request, the hot page's included.
        histogram = self._requests.get((route, method, status))
        if histogram is None:
            labels = (route, method if method in METHODS else "other", str(status))
            histogram = self.http.by_labels.get(labels)
            if histogram is None:
                histogram = self.http.by_labels[labels] = Histogram(self.http.bounds)
            self._requests[route, method, status] = histogram
        histogram.counts[bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1
        histogram.total += seconds

    def read(
        self,
        kind: type[GaugeMetricFamily] | type[CounterMetricFamily],
        name: str,
        help: str,
        labels: tuple[str, ...],
        read: ReadValues,
    ) -> None:
        """A gauge or counter whose values `read` gives at scrape time."""
        self.readers.append(Reader(kind, name, help, labels, read))

    def bus_item(self, kind: str, published: float | None = None) -> None:
        self.bus_notifications.inc((kind,))
        if published is not None:
            self.bus_lag.observe((kind,), max(0.0, time.time() - published))

    # ---- exposition -------------------------------------------------------------------

    def collect(self) -> Iterator[Metric]:
        yield self.http.family()
        yield self.checkpoints.family()
        yield self.turns.family()
        yield self.fanout_lag.family()
        yield self.bus_lag.family()
        yield self.bus_notifications.family()
        yield self.feedback.family()
        yield self.sessions_purged.family()
        for reader in self.readers:
            try:
                yield reader.family()
            except Exception:
                # A holder that is gone (shutting down) is left out of a scrape.
                log.debug("%s could not be read", reader.name, exc_info=True)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


async def answer(metrics: Metrics, scope: Scope, receive: Receive, send: Send) -> None:
    """`GET /metrics` on the main port; any other method is a problem+json 405."""
    if scope["method"] not in ("GET", "HEAD"):
        response = problem_response(
            405,
            detail="Metrics are read with GET",
            headers={"Allow": "GET, HEAD", "X-Request-Id": next_request_id()},
        )
        await response(scope, receive, send)
        return
    body = metrics.exposition()
    headers = [
        (b"content-type", CONTENT_TYPE),
        (b"content-length", str(len(body)).encode()),
    ]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send(
        {
            "type": "http.response.body",
            "body": b"" if scope["method"] == "HEAD" else body,
        }
    )


async def serve_port(metrics: Metrics, host: str, port: int) -> asyncio.Server:
    """A listener of its own for `GET /metrics` (`METRICS_PORT`): the scraper's
    requests never queue behind the service's, and the port can be firewalled apart.
    HTTP/1.0-style: one request per connection, read within 5 seconds, 16 KiB at most."""

    async def handle(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        with contextlib.suppress(Exception):
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5.0)
            except (asyncio.LimitOverrunError, asyncio.IncompleteReadError):
                head = b""
            method, _, rest = head.partition(b" ")
            target = rest.partition(b" ")[0].partition(b"?")[0]
            if method in (b"GET", b"HEAD") and target == b"/metrics":
                body = metrics.exposition()
                status, content_type = b"200 OK", CONTENT_TYPE
            else:
                body = b"not found\n" if head else b"bad request\n"
                status = b"404 Not Found" if head else b"400 Bad Request"
                content_type = b"text/plain; charset=utf-8"
            writer.write(
                b"HTTP/1.1 " + status + b"\r\ncontent-type: " + content_type
                + b"\r\ncontent-length: " + str(len(body)).encode()
                + b"\r\nconnection: close\r\n\r\n"
                + (b"" if method == b"HEAD" else body)
            )  # fmt: skip
            await writer.drain()
        writer.close()

    # `--workers N`: every worker listens on the port; the kernel hands each scrape
    # to one of them.
    return await asyncio.start_server(handle, host, port, limit=16384, reuse_port=True)
