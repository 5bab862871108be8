"""Slow uploads against the real server: a client that sends most of a result at once and then
drips a byte every few tenths of a second is cut off within about one rate window (408, connection
closed), whatever it sent before, while an honest upload still gets a decode slot. Plus the rules
of :class:`vcasync.server._upload_pace.Pace` on their own, without sockets or sleeps."""

from __future__ import annotations

import asyncio
import io
import json
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import torch

from vcasync.errors import ConfigError
from vcasync.ledger._units import make_units
from vcasync.server import ServerConfig
from vcasync.server._upload_pace import BodyTimeouts, Pace
from vcasync.tensors import ModelState

from .conftest import PAYLOAD, result_payload, running
from .test_routes import join, lease

KiB = 1024

# Small limits so the test is quick: 64 KiB/s over any 1 s window, after 1 s of grace.
FAST = ServerConfig(port=0, min_upload_bytes_per_s=64 * KiB, upload_rate_grace_s=1.0,
                    upload_rate_window_s=1.0, body_idle_timeout_s=30.0)


def big_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(512, 1024)      # ~2 MiB of float32: a 2 MiB burst is 32 s at 64 KiB/s


def noisy_result(model: ModelState, lease_id: str, base: int) -> bytes:
    """A result that compresses badly, so "most of the body" really is most of the bytes."""
    g = torch.Generator().manual_seed(1)
    tensors = {k: torch.randn(v.shape, generator=g) * 1e-3 for k, v in model.items()}
    return result_payload(model, lease_id, base, tensors=tensors)


async def drip(url: str, token: str, lease_id: str, body: bytes, every_s: float = 0.3,
               within_s: float = 20.0) -> tuple[int | None, float, float, dict[str, Any] | None]:
    """Send all of ``body`` but its last 1000 bytes at once, then one byte every ``every_s``.

    Returns (status, seconds from the first dripped byte to the answer, seconds from it to the
    server closing the connection, the JSON error body); status None if no answer ``within_s``.
    """
    host, port = url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    head = (f"PUT /v1/leases/{lease_id}/result HTTP/1.1\r\nHost: {host}\r\n"
            f"Authorization: Bearer {token}\r\nContent-Type: {PAYLOAD}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    burst, rest = body[:-1000], body[-1000:]
    writer.write(head + burst)
    await writer.drain()
    started = time.monotonic()

    async def trickle() -> None:
        for i in range(len(rest)):
            await asyncio.sleep(every_s)
            try:
                writer.write(rest[i:i + 1])
                await writer.drain()
            except ConnectionError:
                return

    dripping = asyncio.create_task(trickle())
    try:
        async with asyncio.timeout(within_s):
            raw = await reader.read(65536)
            answered = time.monotonic() - started
            while chunk := await reader.read(65536):   # to EOF: the server closes the connection
                raw += chunk
            closed = time.monotonic() - started
    except TimeoutError:
        return None, within_s, within_s, None
    finally:
        dripping.cancel()
        writer.close()
    head_raw, _, payload = raw.partition(b"\r\n\r\n")
    status = int(head_raw.split(b" ", 2)[1])
    return status, answered, closed, json.loads(payload) if payload else None


async def test_a_drip_after_a_burst_is_cut_within_seconds_and_honest_uploads_get_a_slot(
        tmp_path: Path) -> None:
    async with running(tmp_path, units=make_units(6, steps=3), durability="none", server_config=FAST,
                       initial=big_model()) as (coord, server), aiohttp.ClientSession() as http:
        model = coord.model()
        grants = []
        for name in ("drip-a", "drip-b", "honest"):
            _, token = await join(http, server.url, name)
            grants.append((token, await lease(http, server.url, token)))
        bodies = [noisy_result(model, g["lease_id"], g["base_version"]) for _, g in grants]
        assert min(len(b) for b in bodies) > 1_800_000

        # Two drips hold both decode slots (max_concurrent_decodes = 2) ...
        drips = [asyncio.create_task(drip(server.url, token, g["lease_id"], body))
                 for (token, g), body in zip(grants[:2], bodies[:2], strict=True)]
        await asyncio.sleep(0.3)
        # ... and an honest upload queues behind them until the first is cut off.
        token, g = grants[2]
        t0 = time.monotonic()
        async with http.put(f"{server.url}/v1/leases/{g['lease_id']}/result", data=io.BytesIO(bodies[2]),
                            headers={"Authorization": f"Bearer {token}", "Content-Type": PAYLOAD}) as r:
            assert r.status == 200, await r.text()
            assert (await r.json())["status"] == "accepted"
        honest_s = time.monotonic() - t0

        for status, answered, closed, error in await asyncio.gather(*drips):
            # The old whole-upload average held each drip for ~2 MiB / 64 KiB/s = 32 s.
            assert status == 408, (status, answered)
            assert error is not None
            assert error["error"] == "request_timeout"
            assert "too slow" in error["message"], error
            assert answered < 4.0, answered     # ~ one window (1 s) after the drip began
            assert closed < answered + 1.0, (answered, closed)   # closed at once, no lingering
        assert honest_s < 6.0, honest_s


# -- the rules on their own --------------------------------------------------------------------

T = BodyTimeouts(idle_s=30.0, min_rate=1000.0, grace_s=2.0, window_s=4.0)


def test_a_burst_buys_no_more_than_one_window() -> None:
    pace = Pace(T, expected=10_000_000)
    pace.arrived(0.5, 9_000_000)                 # 9 MB at once: an average would allow 9000 s
    budget, cause = pace.allowance()
    assert cause == "slow"
    assert budget == pytest.approx(4.0)          # the burst leaves the window 4 s later
    pace.arrived(budget, 1)                      # one byte at the very end of it
    budget, cause = pace.allowance()
    assert budget <= 0
    assert cause == "slow"
    assert "bytes in the last 4s" in pace.explain(cause)


def test_a_steady_sender_is_never_cut_and_server_time_is_not_counted() -> None:
    pace = Pace(T, expected=200_000)
    for _ in range(100):                         # 2000 B/s for 100 s of client time
        budget, _ = pace.allowance()
        assert budget > 0.5
        pace.arrived(0.5, 1000)
    # Time the server spends elsewhere between reads never reaches the pace: only waits do.
    assert pace.waited == pytest.approx(50.0)


def test_the_deadline_follows_the_declared_size() -> None:
    # A small body has no business taking a whole window: 500 B at 1000 B/s, plus 2 s of grace.
    pace = Pace(T, expected=500)
    assert pace.deadline == pytest.approx(2.5)
    assert pace.allowance() == (pytest.approx(2.5), "deadline")
    pace.arrived(2.0, 400)
    budget, cause = pace.allowance()
    assert (budget, cause) == (pytest.approx(0.5), "deadline")
    pace.arrived(0.5, 0)
    assert pace.allowance()[0] <= 0
    assert "not complete after 2.5s" in pace.explain("deadline")


def test_nothing_at_all_is_cut_at_the_grace_or_the_stall_timeout() -> None:
    assert Pace(T, expected=10**9).allowance() == (4.0, "slow")   # max(window, grace)
    off = BodyTimeouts(idle_s=3.0, min_rate=0.0)
    assert Pace(off, expected=10).allowance() == (3.0, "stalled")


def test_bad_timeouts_are_refused() -> None:
    with pytest.raises(ConfigError):
        BodyTimeouts(window_s=0)
    with pytest.raises(ConfigError):
        ServerConfig(upload_rate_window_s=-1)
    # found by a tester: shutdown_timeout_s had no check at all, so NaN (or -1) was taken
    for bad in (float("nan"), float("inf"), -1.0):
        with pytest.raises(ConfigError, match=rf"shutdown_timeout_s must be a finite number >= 0 .* {bad}$"):
            ServerConfig(shutdown_timeout_s=bad)
    ServerConfig(shutdown_timeout_s=0.0)


@pytest.mark.parametrize("field", ["body_idle_timeout_s", "idle_timeout_s", "upload_rate_window_s",
                                   "upload_rate_grace_s", "min_upload_bytes_per_s"])
def test_each_timeout_is_refused_by_its_own_name(field: str) -> None:
    # found by a tester: inf passed every check (a slow-loris guard silently off), and the one
    # error named all five fields whichever was wrong
    for bad in (float("nan"), float("inf"), -1.0):
        with pytest.raises(ConfigError, match=rf"^{field} must be a finite number .* got {bad}$"):
            ServerConfig(**{field: bad})


@pytest.mark.parametrize(("field", "bad"), [("chunk_size", 0), ("chunk_size", -1), ("chunk_size", 1 << 31),
                                            ("backlog", 0), ("backlog", -1)])
def test_a_read_size_or_backlog_that_cannot_work_is_refused(field: str, bad: int) -> None:
    # found by a tester: chunk_size = 0 was taken and every upload was then refused as truncated
    with pytest.raises(ConfigError, match=rf"^{field} must be a whole number"):
        ServerConfig(**{field: bad})
