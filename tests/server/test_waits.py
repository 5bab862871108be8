"""No wait the server tells a worker outlasts half the time a finished run is served (``linger_s``):
a worker asleep on a longer one woke after ``vcasync coordinator --linger`` had exited and retried for
its ``--give-up-after``. A real coordinator behind a real aiohttp server on 127.0.0.1, asked through
the worker's own client and raw HTTP (for the ``Retry-After`` header)."""

from __future__ import annotations

import math
from pathlib import Path

import aiohttp
import pytest

from vcasync.errors import NoWorkAvailableError, WorkerBackoffError
from vcasync.ledger._units import make_units
from vcasync.server._waits import MIN_WAIT_S, linger_warning, longest_wait
from vcasync.worker._client import CoordinatorClient

from .conftest import SECRET, bearer, control, running

BACKOFF_S = 30.0        # a failing worker's back-off, far longer than the linger below
LINGER_S = 4.0


async def _backed_off_and_waiting(tmp_path: Path, linger_s: float | None,
                                  ) -> tuple[WorkerBackoffError, NoWorkAvailableError, str]:
    """The ``retry_after`` told to a backed-off worker, and to one waiting for work (with its
    ``Retry-After`` header), by a server lingering ``linger_s``."""
    cfg = {"worker_backoff_s": BACKOFF_S, "worker_backoff_max_s": BACKOFF_S}
    async with running(tmp_path, units=make_units(1, steps=3), coordinator=cfg, linger_s=linger_s,
                       lease_timeout_s=120.0) as (_, server), \
            CoordinatorClient(server.url) as bad, CoordinatorClient(server.url) as holder, \
            aiohttp.ClientSession() as http:
        await bad.join(SECRET, "bad")
        await bad.release((await bad.lease()).lease_id, "trainer error: boom", failed=True)
        with pytest.raises(WorkerBackoffError) as backoff:
            await bad.lease()
        await holder.join(SECRET, "holder")
        await holder.lease()                      # the only unit is out: the next worker waits
        async with CoordinatorClient(server.url) as idle:
            _, token = await idle.join(SECRET, "idle")
            with pytest.raises(NoWorkAvailableError) as no_work:
                await idle.lease()
        async with http.post(f"{server.url}/v1/leases", data=control("lease_request"),
                             headers=bearer(token)) as resp:
            assert resp.status == 503
            header = resp.headers["Retry-After"]
        return backoff.value, no_work.value, header


async def test_waits_are_at_most_half_the_linger(tmp_path: Path) -> None:
    backoff, no_work, header = await _backed_off_and_waiting(tmp_path, LINGER_S)
    assert backoff.retry_after == LINGER_S / 2  # was 30: the worker slept past the coordinator's exit
    assert no_work.retry_after == LINGER_S / 2  # was the heartbeat interval, 30 s here
    assert header == "2"


async def test_the_message_says_the_wait_the_worker_is_told(tmp_path: Path) -> None:
    # The message ended "lease again in 30s" while retry_after said 2: the worker's log (which
    # prints the message) told the operator something else than the worker was told.
    backoff, no_work, _ = await _backed_off_and_waiting(tmp_path, LINGER_S)
    for told in (backoff, no_work):
        assert str(told).endswith("; retry in 2s"), told
        assert "again in" not in str(told), told
        assert "retry later" not in str(told), told
    assert "backing off: no lease for 30s more; retry in 2s" in str(backoff)   # both true
    uncapped, _, _ = await _backed_off_and_waiting(tmp_path / "uncapped", None)
    assert str(uncapped).endswith(f"; retry in {uncapped.retry_after:g}s"), uncapped


async def test_the_heartbeat_interval_told_is_at_most_half_the_linger(tmp_path: Path) -> None:
    """A worker training a unit asks nothing between heartbeats: told every 30 s (a quarter of a
    120 s lease timeout) by a coordinator lingering 4 s, one whose unit another worker delivered
    heard that the run is finished only after the coordinator had exited."""
    async with running(tmp_path, units=make_units(1, steps=3), linger_s=LINGER_S,
                       lease_timeout_s=120.0) as (_, server), CoordinatorClient(server.url) as client:
        await client.join(SECRET, "w")
        grant = await client.lease()
        assert grant.heartbeat_interval_s == LINGER_S / 2            # was 30
        beat = await client.heartbeat(grant.lease_id, 1)
        assert beat.heartbeat_interval_s == LINGER_S / 2
        assert (await client.resume(grant.lease_id)).heartbeat_interval_s == LINGER_S / 2
    async with running(tmp_path / "no-linger", units=make_units(1, steps=3), lease_timeout_s=120.0,
                       ) as (_, server), CoordinatorClient(server.url) as client:
        await client.join(SECRET, "w")
        assert (await client.lease()).heartbeat_interval_s == 30.0  # an embedded Server: as it was


async def test_the_retry_after_header_is_never_past_the_cap_either(tmp_path: Path) -> None:
    # The header is whole seconds: rounding a cap of 3.5 s (linger 7) up to "4" told a plain HTTP
    # client a wait longer than half the linger; it is rounded down to the cap instead.
    backoff, no_work, header = await _backed_off_and_waiting(tmp_path, 7.0)
    assert backoff.retry_after == no_work.retry_after == 3.5
    assert header == "3"


async def test_without_a_linger_waits_are_the_coordinators(tmp_path: Path) -> None:
    # An embedded Server that is not told how long it lingers keeps the coordinator's hints.
    backoff, no_work, header = await _backed_off_and_waiting(tmp_path, None)
    assert backoff.retry_after == pytest.approx(BACKOFF_S, abs=1.0)
    assert no_work.retry_after == pytest.approx(30.0, abs=1.0)
    assert header == "30"


def test_the_cap_is_half_the_linger_never_under_a_second_and_none_without_a_linger() -> None:
    assert longest_wait(10.0) == 5.0
    assert longest_wait(600.0) == 300.0
    assert longest_wait(1.0) == MIN_WAIT_S == 1.0   # asking more than once a second gains nothing
    assert longest_wait(0.0) == math.inf            # no end is served: nothing to hear it within
    assert longest_wait(None) == math.inf
    assert linger_warning(2.0) is None
    assert linger_warning(10.0) is None
    assert "--give-up-after" in (linger_warning(0.0) or "")
    assert "--linger 1.5" in (linger_warning(1.5) or "")
