"""One registry per coordinator, one exposition (prometheus-client): what ``/metrics`` promises."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import aiohttp
import prometheus_client
from prometheus_client.parser import text_string_to_metric_families

from vcasync.metrics import Metrics
from vcasync.server._http_metrics import HttpMetrics

from .conftest import PAYLOAD, running


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_non_finite_gauges_are_spelled_the_standard_way() -> None:
    m = Metrics(lambda: {"nan_gauge": math.nan, "up": math.inf, "down": -math.inf, "version": 3})
    lines = m.render_prometheus().splitlines()
    assert "vcasync_nan_gauge NaN" in lines
    assert "vcasync_up +Inf" in lines
    assert "vcasync_down -Inf" in lines
    assert "vcasync_version 3.0" in lines


def test_http_counters_join_the_coordinator_registry() -> None:
    coord, http = Metrics(), HttpMetrics()
    coord.registry.register(http)
    http.observe("lease", "POST", 201, 0.003, 10, 200)
    http.observe("lease", "POST", 201, 20.0, 10, 200)
    http.auth_failures += 1
    got = _samples(coord.render_prometheus())
    assert got[("vcasync_http_requests_total",
                (("method", "POST"), ("route", "lease"), ("status", "201")))] == 2
    assert got[("vcasync_http_request_seconds_bucket", (("le", "0.005"), ("route", "lease")))] == 1
    assert got[("vcasync_http_request_seconds_bucket", (("le", "+Inf"), ("route", "lease")))] == 2
    assert got[("vcasync_http_request_seconds_count", (("route", "lease"),))] == 2
    assert got[("vcasync_http_request_bytes_total", (("route", "lease"),))] == 20
    assert got[("vcasync_http_auth_failures_total", ())] == 1
    assert got[("vcasync_merges_total", ())] == 0
    coord.registry.unregister(http)
    assert "vcasync_http_requests_total" not in coord.render_prometheus()


def test_two_coordinators_in_one_process_keep_their_own_series() -> None:
    a, b = Metrics(), Metrics()
    a.merges = 5
    a.reject("too_stale", "w1")
    a.staleness.observe(2)
    assert _samples(b.render_prometheus())[("vcasync_merges_total", ())] == 0
    got = _samples(a.render_prometheus())
    assert got[("vcasync_merges_total", ())] == 5
    assert got[("vcasync_worker_rejects_total", (("reason", "too_stale"), ("worker", "w1")))] == 1
    assert got[("vcasync_staleness_bucket", (("le", "2.0"),))] == 1
    assert got[("vcasync_staleness_bucket", (("le", "1.0"),))] == 0
    default = prometheus_client.generate_latest(prometheus_client.REGISTRY).decode()
    assert "vcasync_" not in default


def test_merge_histograms_resume_only_from_what_they_wrote() -> None:
    a = Metrics()
    for staleness, seconds in ((0, 0.02), (3, 0.2), (70, 2.0)):
        a.staleness.observe(staleness)
        a.merge_seconds.observe(seconds)
    b = Metrics()
    b.resume_histograms(a.histograms())
    assert (b.staleness.as_dict(), b.merge_seconds.as_dict()) == \
        (a.staleness.as_dict(), a.merge_seconds.as_dict())
    b.staleness.observe(1)                          # goes on from there
    assert b.staleness.count == 4
    # other bounds (another release's), counts that are not counts, nothing: left as they are
    for bad in ({"staleness": {**a.histograms()["staleness"], "bounds": [0, 1]}},
                {"staleness": {**a.histograms()["staleness"], "counts": [-1] * 9}},
                {"staleness": {**a.histograms()["staleness"], "sum": math.nan}}, None, []):
        fresh = Metrics()
        fresh.resume_histograms(bad)
        assert fresh.staleness.count == 0


def test_every_family_has_help_and_label_values_are_escaped() -> None:
    m = Metrics(lambda: {"workers_alive": 1, "leases_issued_total": 2})
    m.reject("bad", 'q"\n\\')
    text = m.render_prometheus()
    families = list(text_string_to_metric_families(text))
    assert families
    for fam in families:
        assert fam.documentation.strip(), fam.name
    assert 'worker="q\\"\\n\\\\"' in text
    assert {f.name: f.type for f in families}["vcasync_leases_issued"] == "counter"


async def test_request_bytes_count_what_arrived_not_what_was_declared(tmp_path: Path) -> None:
    """Found by a probe: one unauthenticated PUT declaring a Content-Length of 900 TB and sending
    nothing, answered 401 before its body was read, added 9e14 to the result route's bytes."""
    async with running(tmp_path) as (_, server), aiohttp.ClientSession() as http:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"PUT /v1/leases/x/result HTTP/1.1\r\nHost: x\r\nContent-Type: " + PAYLOAD.encode()
                     + b"\r\nContent-Length: 900000000000000\r\n\r\n" + b"\0" * 100)
        await writer.drain()
        assert (await reader.readline()).startswith(b"HTTP/1.1 401")
        writer.close()
        async with http.get(f"{server.url}/metrics") as r:
            got = _samples(await r.text())
    put = (("method", "PUT"), ("route", "result"), ("status", "401"))
    assert got[("vcasync_http_requests_total", put)] == 1
    assert got[("vcasync_http_request_bytes_total", (("route", "result"),))] <= 100
