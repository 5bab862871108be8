"""HTTP-level counters of the coordinator's server, as a prometheus-client collector.

The coordinator keeps its own metrics (merges, rejects, staleness, leases); the server adds what only
it sees: requests by route and status, bytes in and out, request latency, refused credentials. The
server registers an :class:`HttpMetrics` into the coordinator's own registry
(:attr:`vcasync.metrics.Metrics.registry`) while it runs, so ``GET /metrics`` is that one registry's
exposition.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Final

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric

from ..metrics import Histogram

__all__ = ["HttpMetrics", "LATENCY_BUCKETS"]

#: Request latency buckets in seconds (upper bounds; +Inf is implied).
LATENCY_BUCKETS: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)


class HttpMetrics:
    """Counters the server updates per request (single event loop: no locks needed)."""

    def __init__(self) -> None:
        self.requests: dict[tuple[str, str, int], int] = {}
        self.bytes_in: dict[str, int] = {}
        self.bytes_out: dict[str, int] = {}
        self.latency: dict[str, Histogram] = {}
        self.auth_failures = 0
        #: requests aiohttp's parser refused before any route saw them ("request"), and bodies of
        #: requests already answered that did not decode as aiohttp drained them ("body"):
        #: uncounted until 2026-12-07, so a client sending garbage showed in no figure
        self.malformed: dict[str, int] = {}
        #: connections closed for not sending a whole request head within the idle timeout, by what
        #: they sent ("nothing", "partial_head"): uncounted until 2026-12-07 (see ``_stalls``)
        self.stalled: dict[str, int] = {}

    def note_malformed(self, where: str) -> None:
        self.malformed[where] = self.malformed.get(where, 0) + 1

    def note_stalled(self, sent: str) -> None:
        self.stalled[sent] = self.stalled.get(sent, 0) + 1

    def observe(self, route: str, method: str, status: int, seconds: float, bytes_in: int,
                bytes_out: int) -> None:
        key = (route, method, status)
        self.requests[key] = self.requests.get(key, 0) + 1
        self.bytes_in[route] = self.bytes_in.get(route, 0) + bytes_in
        self.bytes_out[route] = self.bytes_out.get(route, 0) + bytes_out
        hist = self.latency.get(route)
        if hist is None:
            hist = self.latency[route] = Histogram(LATENCY_BUCKETS)
        hist.observe(seconds)

    def collect(self) -> Iterator[Metric]:
        """The metric families at this instant (the prometheus-client collector protocol)."""
        requests = CounterMetricFamily("vcasync_http_requests_total",
                                       "HTTP requests by route, method and status",
                                       labels=["route", "method", "status"])
        for (route, method, status), n in sorted(self.requests.items()):
            requests.add_metric([route, method, str(status)], n)
        yield requests
        yield _by_route("vcasync_http_request_bytes_total",
                        "request body bytes received by route (as decoded: after a Content-Encoding)",
                        self.bytes_in)
        yield _by_route("vcasync_http_response_bytes_total", "response body bytes sent by route",
                        self.bytes_out)
        latency = HistogramMetricFamily("vcasync_http_request_seconds", "request handling time by route",
                                        labels=["route"])
        for route, hist in sorted(self.latency.items()):
            hist.add_to(latency, [route])
        yield latency
        yield CounterMetricFamily("vcasync_http_auth_failures_total",
                                  "requests refused for their credentials", value=self.auth_failures)
        malformed = CounterMetricFamily(
            "vcasync_http_malformed_requests_total",
            "requests refused by the HTTP parser before any route (where=request), and bodies of "
            "answered requests that did not decode (where=body)", labels=["where"])
        for where in ("request", "body"):
            malformed.add_metric([where], self.malformed.get(where, 0))
        yield malformed
        stalled = CounterMetricFamily(
            "vcasync_http_stalled_connections_total",
            "connections closed for sending no whole request head within idle_timeout_s: having sent "
            "nothing (sent=nothing) or part of one (sent=partial_head)", labels=["sent"])
        for sent in ("nothing", "partial_head"):
            stalled.add_metric([sent], self.stalled.get(sent, 0))
        yield stalled


def _by_route(name: str, help_: str, values: Mapping[str, int]) -> CounterMetricFamily:
    family = CounterMetricFamily(name, help_, labels=["route"])
    for route, value in sorted(values.items()):
        family.add_metric([route], value)
    return family
