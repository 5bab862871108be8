"""HTTP-level counters of the coordinator's server, and the Prometheus text exposition format.

The coordinator keeps its own metrics (merges, rejects, staleness, leases); the server adds what only
it sees: requests by route and status, bytes in and out, request latency, refused credentials. Both are
rendered into one ``GET /metrics`` page by :func:`render` (text format 0.0.4, no client library).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

__all__ = ["Family", "HttpMetrics", "Sample", "escape_label", "render"]

#: Request latency buckets in seconds (upper bounds; +Inf is implied).
LATENCY_BUCKETS: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)


@dataclass(frozen=True, slots=True)
class Sample:
    """One time series value: ``suffix`` is appended to the family name (``_bucket``, ``_sum``...)."""

    labels: tuple[tuple[str, str], ...]
    value: float
    suffix: str = ""


@dataclass(frozen=True, slots=True)
class Family:
    """A metric family: its name, type (counter, gauge, histogram), help line and samples."""

    name: str
    kind: str
    help: str
    samples: Sequence[Sample]


def escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _fmt(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if math.isnan(value):
        return "NaN"
    if float(value).is_integer() and abs(value) < 2**53:
        return str(int(value))
    return repr(float(value))


def render(families: Iterable[Family]) -> str:
    """The Prometheus text format of ``families``."""
    lines: list[str] = []
    for fam in families:
        lines.append(f"# HELP {fam.name} {fam.help}")
        lines.append(f"# TYPE {fam.name} {fam.kind}")
        for s in fam.samples:
            labels = ",".join(f'{k}="{escape_label(v)}"' for k, v in s.labels)
            lines.append(f"{fam.name}{s.suffix}{{{labels}}} {_fmt(s.value)}" if labels
                         else f"{fam.name}{s.suffix} {_fmt(s.value)}")
    return "\n".join(lines) + "\n"


@dataclass(slots=True)
class _Histogram:
    counts: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS) + 1))
    total: float = 0.0
    n: int = 0

    def observe(self, value: float) -> None:
        for i, bound in enumerate(LATENCY_BUCKETS):
            if value <= bound:
                self.counts[i] += 1
                break
        else:
            self.counts[-1] += 1
        self.total += value
        self.n += 1


class HttpMetrics:
    """Counters the server updates per request (single event loop: no locks needed)."""

    def __init__(self) -> None:
        self.requests: dict[tuple[str, str, int], int] = {}
        self.bytes_in: dict[str, int] = {}
        self.bytes_out: dict[str, int] = {}
        self.latency: dict[str, _Histogram] = {}
        self.auth_failures = 0

    def observe(self, route: str, method: str, status: int, seconds: float, bytes_in: int,
                bytes_out: int) -> None:
        key = (route, method, status)
        self.requests[key] = self.requests.get(key, 0) + 1
        self.bytes_in[route] = self.bytes_in.get(route, 0) + bytes_in
        self.bytes_out[route] = self.bytes_out.get(route, 0) + bytes_out
        hist = self.latency.get(route)
        if hist is None:
            hist = self.latency[route] = _Histogram()
        hist.observe(seconds)

    def families(self) -> list[Family]:
        req = [Sample((("route", r), ("method", m), ("status", str(s))), float(n))
               for (r, m, s), n in sorted(self.requests.items())]
        lat: list[Sample] = []
        for route, h in sorted(self.latency.items()):
            cum = 0
            for bound, c in zip((*LATENCY_BUCKETS, math.inf), h.counts, strict=True):
                cum += c
                le = "+Inf" if math.isinf(bound) else repr(bound)
                lat.append(Sample((("route", route), ("le", le)), float(cum), "_bucket"))
            lat.append(Sample((("route", route),), h.total, "_sum"))
            lat.append(Sample((("route", route),), float(h.n), "_count"))
        return [
            Family("vcasync_http_requests_total", "counter", "HTTP requests by route, method and status",
                   req),
            Family("vcasync_http_request_bytes_total", "counter", "request body bytes received by route",
                   _by_route(self.bytes_in)),
            Family("vcasync_http_response_bytes_total", "counter", "response body bytes sent by route",
                   _by_route(self.bytes_out)),
            Family("vcasync_http_request_seconds", "histogram", "request handling time by route", lat),
            Family("vcasync_http_auth_failures_total", "counter", "requests refused for their credentials",
                   [Sample((), float(self.auth_failures))]),
        ]


def _by_route(values: Mapping[str, int]) -> list[Sample]:
    return [Sample((("route", r),), float(v)) for r, v in sorted(values.items())]
