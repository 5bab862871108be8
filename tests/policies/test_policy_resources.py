"""Merges do not allocate a second model, and give the same bits whatever the thread count."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import Any

import pytest
import torch

from vcasync.policy import build_policy
from vcasync.tensors import ModelState, Update
from vcasync.wire import pack_tree

# One policy per process, peak RSS (VmHWM) reset just before the measured round (Linux clear_refs).
_PROBE = textwrap.dedent("""
    import json, sys
    import torch
    from vcasync.errors import UpdateRejectedError
    from vcasync.policy import build_policy
    from vcasync.tensors import ModelState, Update

    name, params, kind = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
    TENSORS, NUMEL = 6, 4_000_000

    def make(value):
        out = {f"layer{i}.weight": torch.full((NUMEL,), value) for i in range(TENSORS)}
        out["bn.num_batches_tracked"] = torch.tensor(7)
        return ModelState(out)

    def kib(field):
        for line in open("/proc/self/status"):
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
        raise SystemExit("no " + field)

    model, base = make(1.0), make(1.0)
    policy = build_policy(name, params)
    state = policy.init_state(model)

    def results():  # built before the measurement: they are the coordinator's, not the policy's
        value = 0.01 if kind == "delta" else 1.01
        return [make(value * (1.0 if i % 2 else 0.9)).tensors for i in range(16)]

    def round_(tensors):
        for t in tensors:
            try:
                if policy.merge(model, Update(t, kind=kind, base=base, samples=10), state) is not None:
                    return
            except UpdateRejectedError:
                pass

    round_(results())                     # state buffers and scratch are touched once
    batch = results()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")                      # reset the peak to the current RSS
    before = kib("VmRSS")
    round_(batch)
    spaces = [getattr(p, "_ws", None) for p in (policy, getattr(policy, "inner", None))]
    print(json.dumps({"growth": kib("VmHWM") - before, "tensor": NUMEL * 4,
                      "workspace": sum(ws.nbytes for ws in spaces if ws is not None)}))
""")

CASES: list[tuple[str, dict[str, Any], str]] = [
    ("vcasgd", {}, "delta"),
    ("vcasgd", {}, "weights"),
    ("fedasync", {}, "delta"),
    ("fedbuff", {"buffer_size": 2}, "weights"),
    ("diloco", {}, "weights"),
    ("sync", {"buffer_size": 2}, "delta"),
    ("median", {"buffer_size": 3}, "delta"),
    ("trimmed_mean", {"buffer_size": 3}, "weights"),
    ("gate", {"inner": "vcasgd", "warmup": 2}, "weights"),
]


@pytest.mark.parametrize(("name", "params", "kind"), CASES,
                         ids=[f"{n}-{k}" for n, _, k in CASES])
def test_a_merge_allocates_at_most_one_tensor(name: str, params: dict[str, Any], kind: str) -> None:
    out = subprocess.run([sys.executable, "-c", _PROBE, name, json.dumps(params), kind],
                         capture_output=True, text=True, timeout=300, check=True)
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    # A merge allocates at most one tensor-sized temporary (a whole model would be 6 tensors), and
    # the scratch a policy keeps between merges is at most one tensor plus a few small blocks.
    assert figures["growth"] <= figures["tensor"], figures
    assert figures["workspace"] <= figures["tensor"] + (4 << 20), figures


def _stream(numel: int) -> tuple[ModelState, list[Update]]:
    gen = torch.Generator().manual_seed(7)
    model = ModelState({"a": torch.randn(numel, generator=gen),
                        "b": torch.randn(numel // 3 + 1, generator=gen).to(torch.bfloat16),
                        "n": torch.tensor(3)})
    updates = []
    for i in range(6):
        tensors = {"a": torch.randn(numel, generator=gen) * 0.1,
                   "b": (torch.randn(numel // 3 + 1, generator=gen) * 0.1).to(torch.bfloat16),
                   "n": torch.tensor(3 + i)}
        updates.append(Update(tensors, kind="delta" if i % 2 else "weights", staleness=i % 3,
                              samples=i, base=model.clone()))
    return model, updates


@pytest.mark.parametrize("name", ["vcasgd", "fedasync", "fedbuff", "diloco", "median",
                                  "trimmed_mean", "gate", "sync"])
def test_same_bits_with_one_or_two_threads(name: str) -> None:
    params = {"buffer_size": 2} if name in ("fedbuff", "sync", "median", "trimmed_mean") else {}
    if name == "gate":
        params = {"warmup": 1, "z": 1.0}
    results = []
    threads = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            model, updates = _stream(300_001)  # well above torch's parallel grain
            policy = build_policy(name, params)
            state = policy.init_state(model)
            outcomes = []
            for u in updates:
                try:
                    outcomes.append(policy.merge(model, u, state) is not None)
                except Exception as exc:  # the gate refuses some: the refusal must match too
                    outcomes.append(type(exc).__name__)
            results.append((outcomes, model.digest(), pack_tree(state)))
    finally:
        torch.set_num_threads(threads)
    assert results[0] == results[1]
