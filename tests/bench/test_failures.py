"""A benchmark counts the repetitions that failed (raised, or produced wrong output) and keeps them
in its figures as infinite times; ``failed`` was a hard-coded 0 in codec and merge."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

import bench.codec as codec
from bench._stats import finite
from vcasync.errors import UpdateRejectedError


def test_race_counts_calls_that_raise_or_come_out_wrong() -> None:
    calls = {"n": 0}

    def flaky() -> None:
        calls["n"] += 1
        if calls["n"] % 2 == 0:
            raise OSError("disk on fire")

    failures = codec.Failures()
    t = codec.race({"ok": lambda: None, "flaky": flaky, "wrong": lambda: None}, reps=3,
                   min_round_s=0.0, checks={"wrong": lambda: "not bit-exact"}, failures=failures)
    assert math.isfinite(t["ok"])
    assert failures.count["wrong"] == 4                     # the warm-up and 3 rounds, none dropped
    assert t["wrong"] == math.inf
    assert failures.count["flaky"] == 2                     # calls 2 and 4 of 4
    assert failures.first["flaky"] == "OSError: disk on fire"
    assert failures.total() == 6
    assert "ok" not in failures.count


def test_the_round_trip_check_holds_lossless_codecs_to_bits_and_lossy_ones_to_their_bound() -> None:
    sd = codec.trained_like(codec.resnet50_shapes(0.05))
    wire: dict[str, int] = {}
    for name in ("raw", "zstd", "bf16", "fp16"):
        roundtrip, _, check = codec.ours_fns(sd, name, wire, name)
        assert check() == "no output"
        roundtrip()
        assert check() is None, name
    got = {k: v.clone() for k, v in sd.items()}
    got["fc.bias"][0] += 1e-6
    assert codec.mismatch(sd, got, None) == "fc.bias: not bit-exact"
    assert codec.mismatch(sd, got, "bfloat16") is None      # within bf16's bound
    got["fc.bias"][0] += 1.0
    assert codec.mismatch(sd, got, "bfloat16") == "fc.bias: off by more than the bfloat16 bound"
    del got["fc.bias"]
    assert "tensors differ" in (codec.mismatch(sd, got, None) or "")


def test_a_wrong_decoder_is_counted_in_failed_and_sinks_the_figures(monkeypatch: pytest.MonkeyPatch) -> None:
    class Corrupting(codec.PayloadDecoder):
        def finish(self) -> Any:
            payload = super().finish()
            payload.tensors["fc.bias"].add_(1.0)
            return payload

    def broken_save(sd: codec.State) -> Any:
        def run() -> None:
            raise RuntimeError("pickling failed")
        return run

    monkeypatch.setattr(codec, "PayloadDecoder", Corrupting)
    monkeypatch.setattr(codec, "torch_save_fn", broken_save)
    torch.set_num_threads(1)
    rows: list[Any] = []
    figures: dict[str, Any] = {}
    codec.run_size("tiny", 0.05, 1, rows, figures)
    failures = figures["failures_tiny"]
    assert failures["raw"]["first"] == "fc.bias: not bit-exact"
    assert failures["bf16 delta"]["count"] >= 2             # warm-up and the round
    assert failures["torch.save+load"]["first"] == "RuntimeError: pickling failed"
    assert figures["failed_tiny"] == sum(f["count"] for f in failures.values())
    assert figures["raw_vs_memcpy_tiny"] == 0.0             # an infinite time, not a dropped one
    assert finite({"x": figures["raw_vs_torch_save_tiny"]}) == {"x": None}    # inf / inf


def test_merge_counts_failed_repetitions_and_keeps_them_as_infinite(monkeypatch: pytest.MonkeyPatch) -> None:
    import bench.merge as merge

    real_build = merge.build_policy
    calls = {"n": 0}

    class Flaky:
        def __init__(self, inner: Any) -> None:
            self.inner = inner
            self.needs_base = inner.needs_base

        def init_state(self, model: Any) -> Any:
            return self.inner.init_state(model)

        def merge(self, model: Any, update: Any, state: Any) -> None:
            calls["n"] += 1
            if calls["n"] % 2 == 0:
                raise UpdateRejectedError("refused by the test", reason="test")
            self.inner.merge(model, update, state)

    monkeypatch.setattr(merge, "build_policy", lambda name, params: Flaky(real_build(name, params)))
    monkeypatch.setattr(merge, "CASES", [merge.Case("vcasgd", "vcasgd", {"alpha": 0.5})])
    monkeypatch.setattr(merge, "BUILTINS", ["vcasgd"])
    monkeypatch.setattr(merge, "MIXING", ["vcasgd"])
    monkeypatch.setattr(merge, "time_flower", lambda *a, **k: None)
    figures = merge.run([1_000_000], repeats=3)
    # the warm-up (call 1) works; of the 3 timed repetitions, calls 2 and 4 raised
    assert figures["failed"] == 2
    assert figures["failed_vcasgd_1m"] == 2
    assert figures["failures"]["vcasgd_1m"]["count"] == 2
    assert "refused by the test" in figures["failures"]["vcasgd_1m"]["first"]
    spread_ = figures["vcasgd_vs_floor_spread"]
    assert math.isfinite(spread_[0])
    assert spread_[1] == spread_[2] == math.inf            # 2 of 3 repetitions infinite
    assert finite(spread_)[1:] == [None, None]


def test_storage_counts_failed_timed_out_and_wrong_operations() -> None:
    import asyncio

    import bench.storage as storage

    data = b"x" * 1000
    calls = {"put": 0}

    async def put() -> None:
        calls["put"] += 1
        if calls["put"] == 2:
            raise ConnectionResetError("emulator went away")

    async def get() -> bytes:
        return data

    async def bad_get() -> bytes:
        return data[:-1] + b"y"

    async def slow_clean() -> None:
        await asyncio.sleep(10)

    async def nothing() -> None:
        return None

    pair = storage.Pair("fake", put, get, nothing, nothing, bad_get, slow_clean)
    asyncio.run(storage.run_pair(pair, reps=2, warmup=1, size=len(data), data=data, limit_s=0.05))
    assert pair.failures[0] == "ref_get: read back 1000 bytes that differ from the 1000 written"
    assert "put: ConnectionResetError: emulator went away" in pair.failures
    assert pair.failures.count("ref_clean: timed out after 0.05 s") == 3
    assert len(pair.failures) == 3 + 1 + 3                  # every repetition's ref_get, a put, cleans
    assert pair.times["ref_get"] == [math.inf, math.inf]    # kept, as infinite times
    assert pair.times["put"].count(math.inf) == 1


def test_ledger_counts_iterations_that_raised_and_keeps_them_as_infinite(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """bench.ledger had no ``failed``: an iteration that raised ended the bench, its figures lost."""
    import json

    import bench.ledger as ledger

    real = ledger.one_rep
    calls = {"n": 0}

    def flaky(led: Any, out: dict[str, list[float]]) -> None:
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError("snapshot on fire")
        real(led, out)

    monkeypatch.setattr(ledger, "one_rep", flaky)
    assert ledger.main(["--sizes", "1500", "--reps", "3", "--json"]) == 0
    figures = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert figures["failed"] == figures["failed_1k"] == 1
    assert figures["failures_1k"] == "OSError: snapshot on fire"
    assert figures["capture_ms_1k_spread"][2] is None          # the failed iteration: infinite, kept
    assert figures["capture_ms_1k"] > 0                         # the median of the three still a figure
    clean = ledger.main(["--sizes", "1500", "--reps", "1", "--json"])
    assert clean == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["failed"] == 0
