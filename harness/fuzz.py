"""Run hostile inputs against a live coordinator and count what happened.

:func:`fuzz` draws :class:`~harness.hostile.Hostile` requests with hypothesis, sends each
over a keep-alive connection, checks every answer (:func:`~harness.hostile.check_reply`) and,
every ``check_every`` inputs and at the end, that the coordinator's state did not move
(:func:`~harness.probe.fingerprint`). :func:`slow_loris` holds connections that trickle
headers, control bodies and result uploads, and checks that honest workers are served meanwhile and
that the trickles are cut off. Both return plain figures; a test asserts on them, a benchmark prints
them.
"""

from __future__ import annotations

import socket
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed

from . import hostile_payloads as HP
from .hostile import FAMILIES, Hostile, HostileContext, LeaseInfo, check_reply, hostile_requests
from .probe import MSGPACK, PAYLOAD, HttpProbe, fingerprint

__all__ = ["FuzzReport", "SlowLorisReport", "fuzz", "slow_loris"]


@dataclass(slots=True)
class FuzzReport:
    """Inputs tried and refused by family; what went wrong (the first 50 of each kind)."""

    tried: Counter[str] = field(default_factory=Counter)
    refused: Counter[str] = field(default_factory=Counter)
    duplicates: int = 0
    wrong_answers: int = 0
    answers: Counter[str] = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)
    state_changes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def total(self) -> int:
        return sum(self.tried.values())

    @property
    def accepted(self) -> int:
        """Hostile inputs that were not refused as they should have been, or that changed state."""
        return self.wrong_answers + len(self.state_changes)

    def as_dict(self) -> dict[str, Any]:
        return {"tried": self.total, "refused": sum(self.refused.values()), "duplicates": self.duplicates,
                "accepted": self.accepted, "by_family": dict(self.tried), "answers": dict(self.answers),
                "problems": self.problems[:50], "state_changes": self.state_changes[:50],
                "seconds": round(self.seconds, 2)}


def _diff(before: dict[str, Any], after: dict[str, Any]) -> str:
    keys = [k for k in before if before[k] != after.get(k)]
    return ", ".join(f"{k}: {before[k]!r} -> {after.get(k)!r}" for k in keys)


def fuzz(probe: HttpProbe, ctx: HostileContext, *, examples: int,
         families: tuple[str, ...] = FAMILIES, check_every: int = 250, seed: int | None = None,
         report: FuzzReport | None = None,
         on_input: Callable[[Hostile, Any], None] | None = None) -> FuzzReport:
    """Send ``examples`` hostile inputs drawn from ``families``; returns (or extends) a report."""
    rep = report if report is not None else FuzzReport()
    baseline = fingerprint(probe, ctx.victim)
    recent: list[str] = []
    started = time.perf_counter()

    def check_state() -> None:
        nonlocal baseline
        now = fingerprint(probe, ctx.victim)
        if now != baseline:
            rep.state_changes.append(f"{_diff(baseline, now)} after one of: {recent[-check_every:][:20]}")
            baseline = now
        recent.clear()

    def one(h: Hostile) -> None:
        try:
            reply = h.send(probe)
        except Exception as exc:
            rep.tried[h.family] += 1
            rep.wrong_answers += 1
            rep.problems.append(f"{h.family} {h.method} {h.path[:60]} ({h.note}): no answer: {exc!r}"[:300])
            return
        rep.tried[h.family] += 1
        rep.answers[str(reply.status)] += 1
        recent.append(f"{h.family}:{h.note}")
        problem = check_reply(h, reply)
        if problem is None:
            if h.expect == "duplicate":
                rep.duplicates += 1
            else:
                rep.refused[h.family] += 1
        else:
            rep.wrong_answers += 1
            if len(rep.problems) < 200:
                rep.problems.append(f"{h.family} {h.method} {h.path[:60]} ({h.note}): {problem}")
        if on_input is not None:
            on_input(h, reply)
        if rep.total % check_every == 0:
            check_state()

    run = settings(max_examples=examples, database=None, deadline=None, derandomize=seed is None,
                   phases=[Phase.generate], suppress_health_check=list(HealthCheck),
                   print_blob=False)(given(hostile_requests(ctx, families))(one))
    if seed is not None:
        run = hypothesis_seed(seed)(run)
    run()
    check_state()
    rep.seconds += time.perf_counter() - started
    return rep


@dataclass(slots=True)
class SlowLorisReport:
    connections: int = 0
    cut_off: int = 0                      # answered 408 (or closed) by the server
    answers: Counter[str] = field(default_factory=Counter)
    honest_ok: int = 0
    honest_failed: list[str] = field(default_factory=list)
    honest_upload_s: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"connections": self.connections, "cut_off": self.cut_off, "answers": dict(self.answers),
                "honest_ok": self.honest_ok, "honest_failed": self.honest_failed,
                "honest_upload_s": self.honest_upload_s}


def _open(port: int, head: bytes) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(head)
    return s


def _answer(s: socket.socket) -> str:
    """The status code a slow connection got ("closed" when the server just hung up)."""
    s.settimeout(0.05)
    try:
        data = s.recv(4096)
    except (TimeoutError, BlockingIOError):
        return "pending"
    except OSError:
        return "closed"
    if not data:
        return "closed"
    parts = data.split(b" ", 2)
    return parts[1].decode("ascii", "replace") if len(parts) > 1 else "garbage"


def slow_loris(port: int, ctx: HostileContext, *, per_kind: int = 2, trickle_s: float = 1.0,
               duration_s: float = 20.0, honest: Callable[[HttpProbe], None] | None = None
               ) -> SlowLorisReport:
    """Trickle headers, control bodies and result uploads on ``per_kind`` connections each for up to
    ``duration_s``; meanwhile, and on after the server has cut them all off, run ``honest``
    (default: a heartbeat) every ``trickle_s`` for the whole ``duration_s`` and, once, upload the
    victim's result. Needs ``ctx.spare_leases`` (one per slow upload)."""
    rep = SlowLorisReport()
    auth = f"Authorization: Bearer {ctx.attacker}\r\n".encode()
    socks: list[tuple[str, socket.socket, bytes]] = []
    for _ in range(per_kind):
        socks.append(("headers", _open(port, b"POST /v1/leases HTTP/1.1\r\nHost: x\r\n" + auth), b"X-Slow: "))
        socks.append(("control", _open(port, b"POST /v1/leases HTTP/1.1\r\nHost: x\r\n" + auth
                                       + f"Content-Type: {MSGPACK}\r\nContent-Length: 200\r\n\r\n".encode()),
                      b"\x00"))
    for lease in ctx.spare_leases:
        body = HP.valid_result(ctx.model, lease.lease_id, lease.base_version, steps=lease.steps)
        head = (f"PUT /v1/leases/{lease.lease_id}/result HTTP/1.1\r\nHost: x\r\n").encode() + auth + \
            f"Content-Type: {PAYLOAD}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        socks.append(("upload", _open(port, head + body[: len(body) // 2]), body[len(body) // 2:]))
    rep.connections = len(socks)
    open_ = {i: 0 for i in range(len(socks))}
    deadline = time.monotonic() + duration_s
    uploaded = False
    with HttpProbe("127.0.0.1", port, timeout=duration_s + 30) as probe:
        while time.monotonic() < deadline:
            for i in list(open_):
                kind, s, rest = socks[i]
                answer = _answer(s)
                if answer != "pending":
                    rep.answers[f"{kind}:{answer}"] += 1
                    rep.cut_off += 1
                    del open_[i]
                    continue
                pos = open_[i] % max(1, len(rest))
                try:
                    s.sendall(rest[pos:pos + 1])
                    open_[i] += 1
                except OSError:
                    rep.answers[f"{kind}:closed"] += 1
                    rep.cut_off += 1
                    del open_[i]
            try:
                (honest or _heartbeat(ctx))(probe)
                rep.honest_ok += 1
            except Exception as exc:
                rep.honest_failed.append(repr(exc)[:200])
            if not uploaded:
                uploaded = True
                t0 = time.monotonic()
                try:
                    _honest_upload(probe, ctx)
                    rep.honest_upload_s = time.monotonic() - t0
                except Exception as exc:
                    rep.honest_failed.append(f"upload: {exc!r}"[:200])
            time.sleep(trickle_s)
    for _, s, _ in socks:
        s.close()
    return rep


def _heartbeat(ctx: HostileContext) -> Callable[[HttpProbe], None]:
    def beat(probe: HttpProbe) -> None:
        r = probe.control(f"/v1/leases/{ctx.open_v.lease_id}/heartbeat", "heartbeat",
                          {"steps_done": 1}, ctx.victim)
        if r.status != 200:
            raise RuntimeError(f"heartbeat answered {r.status}: {r.body[:120]!r}")
    return beat


def _honest_upload(probe: HttpProbe, ctx: HostileContext) -> None:
    r = probe.control("/v1/leases", "lease_request", {}, ctx.victim)
    g = r.message()
    if r.status != 201 or not isinstance(g, dict):
        raise RuntimeError(f"honest lease answered {r.status}: {r.body[:160]!r}")
    lease = LeaseInfo(g["lease_id"], int(g["unit"]["steps"]), int(g["base_version"]))
    body = HP.valid_result(ctx.model, lease.lease_id, lease.base_version, steps=lease.steps)
    r = probe.request("PUT", f"/v1/leases/{lease.lease_id}/result", body=body,
                      headers={"Authorization": f"Bearer {ctx.victim}", "Content-Type": PAYLOAD})
    if r.status != 200:
        raise RuntimeError(f"honest upload answered {r.status}: {r.body[:160]!r}")
