"""Merge-level defence: with the ``gate`` policy, a worker that sends scaled, sign-flipped or random
updates cannot move the model beyond the stated bound, and is reported in status and metrics.

The bound: ``gate(inner=vcasgd(alpha), max_norm=B)`` accepts a delta ``d`` only if ``|d| <= B`` (and
within ``z`` running spreads of the accepted norms and cosines), and VC-ASGD then moves the model by
``(1 - alpha) (w_base + d - w)``: for a result on the current version, at most ``(1 - alpha) B``.
"""

from __future__ import annotations

import math
from pathlib import Path

import aiohttp
import torch

from harness import hostile_payloads as HP
from vcasync.policy import build_policy
from vcasync.tensors import ModelState

from .conftest import PAYLOAD, call, digits_model, join, lease, serving

ALPHA = 0.5
BOUND = 2.0     # max_norm


def distance(a: ModelState, b: ModelState) -> float:
    return math.sqrt(sum(float(((a[k].double() - b[k].double()) ** 2).sum()) for k in a))


def honest_delta(model: ModelState, direction: dict[str, torch.Tensor], gen: torch.Generator,
                 norm: float = 1.0) -> dict[str, torch.Tensor]:
    """A common descent direction plus 30 % noise, of norm ``norm``: what honest workers agree on."""
    raw = {k: direction[k] + 0.3 * torch.randn(v.shape, generator=gen) for k, v in model.items()}
    scale = norm / math.sqrt(sum(float((t ** 2).sum()) for t in raw.values()))
    return {k: (t * scale).to(model[k].dtype) for k, t in raw.items()}


async def test_gate_bounds_what_scaled_flipped_and_random_updates_can_do(tmp_path: Path) -> None:
    gate = build_policy("gate", {"inner": "vcasgd", "inner_params": {"alpha": ALPHA}, "warmup": 5,
                                 "z": 3.0, "max_norm": BOUND})
    gen = torch.Generator().manual_seed(3)
    start = digits_model()
    direction = {k: torch.randn(v.shape, generator=gen) for k, v in start.items()}
    async with serving(tmp_path, units=40, policy=gate) as (coord, server, _), \
            aiohttp.ClientSession() as http:
        honest_id, honest = await join(http, server.url, "honest")
        attacker_id, attacker = await join(http, server.url, "attacker")

        async def send(token: str, make: str) -> tuple[str, float]:
            g = await lease(http, server.url, token)
            before = coord.model()
            assert before.version == g["base_version"]
            d = honest_delta(before, direction, gen)
            if make == "scaled":
                d = {k: 10.0 * v for k, v in d.items()}
            elif make == "flipped":
                d = {k: -v for k, v in d.items()}
            elif make == "random":
                r = {k: torch.randn(v.shape, generator=gen) for k, v in d.items()}
                n = math.sqrt(sum(float((t ** 2).sum()) for t in r.values()))
                d = {k: v / n for k, v in r.items()}
            body = HP.valid_result(before, g["lease_id"], g["base_version"], steps=g["unit"]["steps"],
                                   tensors=d)
            status, receipt, raw = await call(http, "PUT", f"{server.url}/v1/leases/{g['lease_id']}/result",
                                              token, data=body, ctype=PAYLOAD)
            assert status == 200, raw[:300]
            return receipt["status"], distance(before, coord.model())

        for _ in range(8):                                       # warm-up: honest results only
            status, moved = await send(honest, "honest")
            assert status == "accepted"
            assert moved <= (1 - ALPHA) * BOUND + 1e-6
        moved_by_attacker = 0.0
        refused = 0
        for round_ in range(4):
            for attack in ("scaled", "flipped", "random"):
                status, moved = await send(attacker, attack)
                assert moved <= (1 - ALPHA) * BOUND + 1e-6, (attack, moved)
                moved_by_attacker += moved
                refused += status == "rejected"
            status, moved = await send(honest, "honest")
            assert status == "accepted", round_                    # honest work still gets through
        assert refused == 12
        assert moved_by_attacker == 0.0

        st = coord.status()
        assert attacker_id in st["suspects"]
        assert honest_id not in st["suspects"]
        reasons = st["suspects"][attacker_id]
        assert set(reasons) <= {"norm_outlier", "direction_outlier"}
        assert sum(reasons.values()) == 12
        async with http.get(f"{server.url}/metrics") as r:
            text = await r.text()
        lines = [ln for ln in text.splitlines() if ln.startswith("vcasync_worker_rejects_total{")]
        assert lines
        assert all(f'worker="{attacker_id}"' in ln for ln in lines)
        assert sum(float(ln.rsplit(" ", 1)[1]) for ln in lines) == 12
