"""A coordinator and four worker processes train the digits example on 127.0.0.1 while workers are
SIGKILLed and SIGTERMed mid-unit and the coordinator is SIGKILLed mid-run; each is restarted with the
same state. Afterwards, from the durable state alone: every unit merged exactly once, no acknowledged
result lost, versions only went forward, and the model is finite and better than at the start."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

from tests._procs import wait_until
from vcasync.coordinator import Coordinator, CoordinatorConfig
from vcasync.examples.digits import evaluate, model
from vcasync.policy import build_policy
from vcasync.runconfig import UnitsConfig
from vcasync.storage import open_storage
from vcasync.tensors import ModelState

from .conftest import HERE, SECRET, Procs, free_port

pytestmark = pytest.mark.slow

SHARDS, EPOCHS, STEPS = 4, 4, 80
ACK = re.compile(r"result for lease (\S+) \(unit (\S+)\) (accepted|duplicate); model is now v(\d+)")


class Probe:
    """Reads the coordinator's version from /healthz and checks it never goes back."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.seen: list[int] = []

    def version(self) -> int | None:
        try:
            with urllib.request.urlopen(f"{self.url}/healthz", timeout=2) as r:
                v = int(json.loads(r.read())["version"])
        except (OSError, urllib.error.URLError, ValueError):
            return None
        if self.seen:
            assert v >= self.seen[-1], f"version went back from {self.seen[-1]} to {v}"
        self.seen.append(v)
        return v

    def at_least(self, n: int) -> bool:
        v = self.version()
        return v is not None and v >= n


def request(url: str, method: str, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, Any]:
    req = urllib.request.Request(url + path, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def early_in_a_unit(state: Path) -> bool:
    """True while the worker is training, with a checkpoint from the first half of its unit: a signal
    sent now lands mid-unit, seconds before the unit could end."""
    if list((state / "results").glob("*.vca")) if (state / "results").exists() else []:
        return False
    for path in (state / "checkpoints").glob("*.pt") if (state / "checkpoints").exists() else []:
        try:
            step = int(torch.load(path, weights_only=True)["step"])
        except (OSError, RuntimeError, KeyError, EOFError):
            continue
        if 0 < step <= STEPS // 2:
            return True
    return False


async def recovered(store: Path) -> tuple[dict[str, Any], ModelState]:
    """Open the run's storage in a fresh Coordinator: what it recovers is what was durable."""
    torch.manual_seed(0)
    initial = ModelState.from_module(model())
    # The same units the coordinator was started with (its --unit-param included): the run is
    # recorded with them, and a start with other units is refused.
    units = UnitsConfig(shards=SHARDS, epochs=EPOCHS, steps=STEPS,
                        params={"checkpoint_every": 10}).build()
    async with open_storage(f"file://{store}") as storage, \
            Coordinator(initial, units, policy=build_policy("vcasgd"), storage=storage,
                        config=CoordinatorConfig(durability="journal")) as coord:
        return coord.status(), coord.model()


def test_fleet_survives_kills(procs: Procs, tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    store = tmp_path / "store"
    coord_args = ["coordinator", "--model", "vcasync.examples.digits:model", "--shards", str(SHARDS),
                  "--epochs", str(EPOCHS), "--steps", str(STEPS), "--unit-param", "checkpoint_every=10",
                  "--storage", f"file://{store}", "--durability", "journal", "--lease-timeout", "60",
                  "--port", str(port), "--linger", "600"]
    coord = procs.start("coord", *coord_args)
    probe = Probe(url)
    wait_until("the coordinator", lambda: probe.version() is not None, 60)

    def start_worker(i: int) -> Any:
        return procs.start(f"w{i}", "worker", "--coordinator", url, "--trainer", "slow_digits:train",
                           "--app-dir", str(HERE), "--state-dir", str(tmp_path / f"w{i}"),
                           "--grace-period", "15")

    workers = {i: start_worker(i) for i in range(4)}

    # Hostile requests against the real process change nothing.
    v = probe.version()
    assert request(url, "POST", "/v1/leases", b"{}", {"Authorization": "Bearer vca_" + "0" * 40})[0] == 401
    status, body = request(url, "POST", "/v1/join", b"{}", {"Authorization": "Bearer nope"})
    assert status == 401
    assert body["error"] == "unauthorized"
    status, body = request(url, "POST", "/v1/join", b"{}", {"Authorization": f"Bearer {SECRET}",
                                                          "Content-Type": "application/json"})
    assert status == 200
    token = body["token"]
    status, body = request(url, "PUT", "/v1/leases/forged-lease/result", b"\x00garbage",
                           {"Authorization": f"Bearer {token}",
                            "Content-Type": "application/x-vcasync-payload"})
    assert 400 <= status < 500
    assert body["error"]
    assert probe.version() == v

    # The coordinator SIGKILLed mid-run and restarted on the same port and storage.
    wait_until("a few merges", lambda: probe.at_least(2))
    coord.send_signal(signal.SIGKILL)
    coord.wait(30)
    coord = procs.start("coord", *coord_args)
    wait_until("the restarted coordinator", lambda: probe.version() is not None, 90)

    # A worker SIGKILLed mid-unit (after a checkpoint), restarted with the same state dir.
    wait_until("w0 to checkpoint early in a unit", lambda: early_in_a_unit(tmp_path / "w0"))
    workers[0].send_signal(signal.SIGKILL)
    workers[0].wait(30)
    workers[0] = start_worker(0)

    # A worker SIGTERMed mid-unit: it saves, keeps its lease in the state dir and exits 0; restarted,
    # it resumes the same lease from its checkpoint. (A unit leased out before the coordinator crash
    # may have been leased twice since; if the other holder's result closed it first, the worker is
    # told so and the preemption is tried again on its next unit.)
    resumed = False
    for _ in range(3):
        wait_until("w1 to checkpoint early in a unit", lambda: early_in_a_unit(tmp_path / "w1"))
        workers[1].send_signal(signal.SIGTERM)
        assert workers[1].wait(30) == 0
        seen = len(procs.log("w1"))
        assert "preempted" in procs.log("w1")[-2000:]
        workers[1] = start_worker(1)
        def picked_up(seen: int = seen) -> bool:
            return any(m in procs.log("w1")[seen:] for m in ("resumed lease", "cannot be resumed"))

        wait_until("w1 to pick its lease up", picked_up, 120)
        if "resumed lease" in procs.log("w1")[seen:]:
            resumed = True
            break
        assert "UnitClosedError" in procs.log("w1")[seen:], procs.log("w1")[seen:]
    assert resumed, "the SIGTERMed worker never resumed its lease"

    for i, w in workers.items():
        assert w.wait(240) == 0, procs.log(f"w{i}")[-3000:]
    coord.send_signal(signal.SIGTERM)
    assert coord.wait(60) == 0, procs.log("coord")[-3000:]

    logs = "".join(procs.log(f"w{i}") for i in range(4))
    acks = ACK.findall(logs)
    accepted = Counter(unit for _, unit, kind, _ in acks if kind == "accepted")
    assert max(accepted.values()) == 1, f"a unit acknowledged as merged twice: {accepted}"
    acked_units = {unit for _, unit, _, _ in acks}

    status, final = asyncio.run(recovered(store))
    units = status["units"]
    assert units["done"] == SHARDS * EPOCHS, status
    assert units.get("parked", 0) == 0
    assert units.get("queued", 0) == 0
    assert units.get("leased", 0) == 0
    assert len(acked_units) == SHARDS * EPOCHS  # every unit's result was acknowledged to some worker
    # Versions only went forward, and the recovered state is at least as new as anything acknowledged.
    assert probe.seen == sorted(probe.seen)
    assert final.version >= max(int(v) for *_, v in acks)
    assert final.version == SHARDS * EPOCHS  # one version per merged unit: nothing merged twice
    for name, t in final.items():
        assert torch.isfinite(t).all(), name
    torch.manual_seed(0)
    before = evaluate(model())
    after = evaluate(final)
    assert after > max(0.6, before + 0.3), (before, after)
