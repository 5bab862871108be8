"""bench.load counts every submitter error in ``failed`` (it listed them in ``submit_errors`` and
left them out)."""

from __future__ import annotations

import asyncio
import socket

import pytest

from vcasync._loop import run


def _closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"   # nothing listens once it is closed


def test_a_submitter_that_cannot_reach_the_coordinator_counts_its_errors() -> None:
    # The submitter raised aiohttp's connection error out of its task group: the run ended in a
    # traceback instead of a figure.
    from bench.load import submitter

    async def go() -> dict[str, int]:
        stop, errors = asyncio.Event(), {}
        asyncio.get_running_loop().call_later(0.5, stop.set)
        await submitter(_closed_port(), stop, [], errors, __import__("random").Random(0))
        return errors

    errors = run(go())
    assert set(errors) == {"join: ClientConnectorError"}
    assert 1 <= errors["join: ClientConnectorError"] <= 10     # tried again, not in a hot loop


@pytest.mark.slow
def test_submitter_errors_count_in_failed() -> None:
    # A ledger of one unit: the submitters' leases are refused (no work), and so are the fleet's
    # but one. Before, `failed` held the fleet's failures only.
    from bench import load
    from bench._proc import peer

    with peer("coordinator", "--params", "1000", "--units", "1", "--steps", "1000000") as url:
        r = run(load.measure(url, 20, 0.5, 1, 10, 2))
    assert sum(r["submit_errors"].values()) > 0, r
    assert r["failed"] == sum(r["errors"].values()) + sum(r["submit_errors"].values())
    assert all(k.startswith("submit: ") for k in r["submit_errors"]), r["submit_errors"]
