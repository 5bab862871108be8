"""Hostile inputs for every route of the coordinator's HTTP API, as hypothesis strategies.

:func:`prepare` sets the scene on a running coordinator: an *attacker* and a *victim* worker, each
with an open lease and a lease whose result was already accepted (so replays have something to
replay). :func:`hostile_requests` then draws :class:`Hostile` requests, each wrong in one way:

- ``auth``: no, malformed, forged, foreign or tampered credentials on every protected route;
- ``join``: wrong join credentials, or the right one with a malformed body;
- ``control``: bodies that are random, truncated, of the wrong kind or version, mistyped, oversized;
- ``path``: unknown, overlong or someone else's lease ids; bad model versions; unknown routes and
  methods;
- ``result``: random and truncated payloads, single byte flips, trailing junk, one mutated metadata
  field or tensor (name, shape, dtype, NaN/Inf), declared shapes that overflow, dtypes and codecs
  outside the allow-lists, lying counts, a terabyte header, a zstd decompression bomb;
- ``replay``: results re-sent to someone else's lease, to the wrong lease, by the wrong worker;
- ``headers``: oversized and too many headers.

Every one must be answered with a 4xx and a JSON ``{"error", "message"}`` body and change nothing,
except a result the owner re-sends to its own closed lease, which is answered 200 ``duplicate``
(the lease id is the idempotency key; nothing changes either). :func:`check_reply` says whether an
answer is right. Inputs are constructed to be invalid; none is "accidentally valid".
"""

from __future__ import annotations

import asyncio
import math
import string
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import quote

import msgpack
import torch
from hypothesis import strategies as st

from vcasync.protocol import _messages as P
from vcasync.server._auth import TokenAuthority
from vcasync.tensors import ModelState
from vcasync.wire import decode_payload_bytes, encode_message

from . import hostile_payloads as HP
from .probe import MSGPACK, PAYLOAD, HttpProbe

__all__ = ["FAMILIES", "Hostile", "HostileContext", "LeaseInfo", "check_reply", "hostile_requests",
           "prepare"]

FAMILIES: Final = ("auth", "join", "control", "path", "result", "replay", "headers")
_TEXT: Final = string.ascii_letters + string.digits + string.punctuation + " "


@dataclass(frozen=True, slots=True)
class Hostile:
    """One request and what must come back: ``"refused"`` (4xx + JSON) or ``"duplicate"``."""

    family: str
    method: str
    path: str
    headers: tuple[tuple[str, str], ...]
    body: bytes = b""
    expect: str = "refused"
    note: str = ""

    def send(self, probe: HttpProbe) -> Any:
        return probe.request(self.method, self.path, headers=dict(self.headers), body=self.body)


@dataclass(frozen=True, slots=True)
class LeaseInfo:
    lease_id: str
    steps: int
    base_version: int
    payload: bytes = b""     # the accepted result, for closed leases


@dataclass(slots=True)
class HostileContext:
    secret: str
    attacker: str
    victim: str
    open_a: LeaseInfo
    open_v: LeaseInfo
    closed_a: LeaseInfo
    closed_v: LeaseInfo
    model: ModelState
    foreign_token: str
    spare_leases: list[LeaseInfo] = field(default_factory=list)


def _auth(token: str, ctype: str = MSGPACK) -> tuple[tuple[str, str], ...]:
    return (("Authorization", f"Bearer {token}"), ("Content-Type", ctype), ("Accept", "application/json"))


def _ok(reply: Any, what: str) -> dict[str, Any]:
    body = reply.message()
    if reply.status >= 300 or not isinstance(body, dict):
        raise RuntimeError(f"{what} answered {reply.status}: {reply.body[:300]!r}")
    return body


def _lease(probe: HttpProbe, token: str) -> LeaseInfo:
    g = _ok(probe.control("/v1/leases", "lease_request", {}, token), "lease")
    return LeaseInfo(g["lease_id"], int(g["unit"]["steps"]), int(g["base_version"]))


def _closed(probe: HttpProbe, token: str, model: ModelState) -> LeaseInfo:
    lease = _lease(probe, token)
    data = HP.valid_result(model, lease.lease_id, lease.base_version, steps=lease.steps)
    r = _ok(probe.request("PUT", f"/v1/leases/{lease.lease_id}/result", body=data,
                          headers=dict(_auth(token, PAYLOAD))), "result")
    if r.get("status") != "accepted":
        raise RuntimeError(f"setting up a closed lease: result {r}")
    return LeaseInfo(lease.lease_id, lease.steps, lease.base_version, data)


def prepare(probe: HttpProbe, secret: str, *, spare: int = 0) -> HostileContext:
    """Join an attacker and a victim, give each an open and a closed lease (plus ``spare`` open
    leases for the attacker, e.g. for slow uploads). Needs a run with at least ``4 + spare`` units."""
    tokens = [_ok(probe.control("/v1/join", "join", {"name": n}, secret), "join")["token"]
              for n in ("attacker", "victim")]
    attacker, victim = tokens
    reply = probe.request("GET", "/v1/models/latest", headers=dict(_auth(victim)))
    if reply.status != 200:
        raise RuntimeError(f"model download answered {reply.status}")
    p = decode_payload_bytes(reply.body, expected_kind="model")
    model = ModelState(p.tensors, int(p.meta["version"]))
    closed_a, closed_v = _closed(probe, attacker, model), _closed(probe, victim, model)
    open_a, open_v = _lease(probe, attacker), _lease(probe, victim)
    spares = [_lease(probe, attacker) for _ in range(spare)]
    foreign = asyncio.run(TokenAuthority(join_secret="another-run-secret-0123456789").issue("w"))
    return HostileContext(secret, attacker, victim, open_a, open_v, closed_a, closed_v, model,
                          foreign, spares)


def check_reply(h: Hostile, reply: Any) -> str | None:
    """None when ``reply`` is the right answer to ``h``, else what is wrong with it."""
    body = reply.json()
    if h.expect == "duplicate":
        if reply.status == 200 and isinstance(body, dict) and body.get("status") == "duplicate":
            return None
        return f"expected 200 duplicate, got {reply.status} {reply.body[:120]!r}"
    if not 400 <= reply.status < 500:
        return f"status {reply.status} (want 4xx): {reply.body[:160]!r}"
    if reply.content_type != "application/json":
        return f"status {reply.status} with content type {reply.content_type!r}: {reply.body[:120]!r}"
    if not (isinstance(body, dict) and isinstance(body.get("error"), str)
            and isinstance(body.get("message"), str) and body["message"]):
        return f"status {reply.status} without a JSON error/message: {reply.body[:120]!r}"
    return None


# -- building blocks -------------------------------------------------------------------------------

def _text(min_size: int = 0, max_size: int = 40) -> st.SearchStrategy[str]:
    return st.text(alphabet=_TEXT, min_size=min_size, max_size=max_size)


_VALID_BODIES: Final[Mapping[str, tuple[str, dict[str, Any]]]] = {
    "lease": ("lease_request", {}), "resume": ("resume", {}),
    "heartbeat": ("heartbeat", {"steps_done": 1}), "release": ("release", {"reason": "fuzz"}),
    "join": ("join", {"name": "fuzz"}),
}


def _route_path(route: str, lease_id: str) -> tuple[str, str]:
    if route == "lease":
        return "POST", "/v1/leases"
    if route == "join":
        return "POST", "/v1/join"
    if route == "result":
        return "PUT", f"/v1/leases/{lease_id}/result"
    if route in ("model", "status"):
        return "GET", "/v1/models/latest" if route == "model" else "/v1/status"
    return "POST", f"/v1/leases/{lease_id}/{route}"


def _bad_credentials(ctx: HostileContext) -> st.SearchStrategy[str | None]:
    a = ctx.attacker
    forged = st.builds(lambda i, s: f"Bearer vca_{i}_{s}", st.text("0123456789abcdef", min_size=16,
                                                                  max_size=16), _text(1, 60))
    sep = len("vca_") + 16   # the separator is not part of either secret: changing it is no attack
    tampered = st.integers(len("vca_"), len(a) - 1).filter(lambda i: i != sep).flatmap(
        lambda i: st.sampled_from(string.ascii_letters).filter(lambda c: c != a[i]).map(
            lambda c: f"Bearer {a[:i]}{c}{a[i + 1:]}"))
    return st.one_of(
        st.none(), st.sampled_from(["", "Bearer", "Bearer ", "bearer", "Basic dXNlcjpwYXNzd29yZA==",
                                    "Token abc", f"Bearer {ctx.secret}", f"Bearer {ctx.foreign_token}",
                                    f"Basic {a}", f"Bearer {a[:-1]}", f"Bearer {a}x",
                                    f"Bearer {a[:len('vca_') + 16]}"]),
        forged, tampered, _text(1, 80), _text(1, 80).map(lambda s: f"Bearer {s}"))


def _valid_body(route: str, ctx: HostileContext, lease: LeaseInfo) -> tuple[bytes, str]:
    if route == "result":
        return HP.valid_result(ctx.model, lease.lease_id, lease.base_version, steps=lease.steps), PAYLOAD
    if route in ("model", "status"):
        return b"", ""
    kind, body = _VALID_BODIES[route]
    return encode_message(kind, body), MSGPACK


def auth_attacks(ctx: HostileContext) -> st.SearchStrategy[Hostile]:
    def build(route: str, cred: str | None) -> Hostile:
        method, path = _route_path(route, ctx.open_a.lease_id)
        body, ctype = _valid_body(route, ctx, ctx.open_a)
        headers: tuple[tuple[str, str], ...] = (("Content-Type", ctype),) if ctype else ()
        if cred is not None:
            headers += (("Authorization", cred),)
        return Hostile("auth", method, path, headers, body, note=f"{route} with {str(cred)[:40]!r}")

    routes = st.sampled_from(["lease", "resume", "heartbeat", "result", "release", "model", "status"])
    return st.builds(build, routes, _bad_credentials(ctx))


def join_attacks(ctx: HostileContext) -> st.SearchStrategy[Hostile]:
    wrong = st.one_of(_text(0, 80), st.sampled_from([ctx.attacker, ctx.foreign_token, ctx.secret[:-1],
                                                     ctx.secret + " x", ctx.secret.upper()]))
    bad_cred = wrong.filter(lambda s: s.strip() != ctx.secret).map(
        lambda s: Hostile("join", "POST", "/v1/join", _auth(s), encode_message("join", {"name": "j"}),
                          note="wrong join credential"))
    bad_body = _bad_control_body("join").map(
        lambda b: Hostile("join", "POST", "/v1/join", _auth(ctx.secret, b[1]), b[0], note=b[2]))
    return st.one_of(bad_cred, bad_body)


def _bad_control_body(route: str) -> st.SearchStrategy[tuple[bytes, str, str]]:
    """(body, content type, note): control bodies that must be refused for ``route``."""
    kind, valid = _VALID_BODIES[route]
    good = encode_message(kind, valid)
    mistyped_values = st.one_of(st.text(max_size=5), st.floats(allow_nan=True), st.booleans(),
                                st.lists(st.integers(-2**63, 2**63 - 1), max_size=3),
                                st.integers(-2**63, -1), st.just(None),
                                st.integers(min_value=2**63, max_value=2**64 - 1))
    fields = {"heartbeat": "steps_done", "release": "reason", "join": "name"}
    options: list[st.SearchStrategy[tuple[bytes, str, str]]] = [
        st.binary(min_size=1, max_size=512).filter(lambda b: not _decodes(b, kind)).map(
            lambda b: (b, MSGPACK, "random bytes")),
        st.integers(1, len(good) - 1).map(lambda i: (good[:i], MSGPACK, f"truncated at {i}")),
        _text(1, 40).filter(lambda k: k != kind).map(
            lambda k: (encode_message(k, valid), MSGPACK, f"wrong kind {k!r}")),
        st.integers(2, 2**31).map(lambda v: (_msg(v, kind, valid), MSGPACK, f"protocol version {v}")),
        st.integers(64 * 1024 + 1, 70 * 1024).map(lambda n: (b"\x00" * n, MSGPACK, f"{n} byte body")),
        st.sampled_from([b"[]", b"1", b'"x"', b"{", b"nul", b'{"kind": "other"}']).map(
            lambda b: (b, "application/json", f"bad json {b!r}")),
        st.sampled_from(["text/html", "application/xml", "image/png"]).map(
            lambda c: (good, c, f"unsupported content type {c}")),
    ]
    if route in fields:
        name = fields[route]
        if route == "join":
            mistyped_values = st.one_of(mistyped_values.filter(lambda v: not isinstance(v, str)),
                                        st.text(min_size=129, max_size=300))
        elif route == "release":
            mistyped_values = st.one_of(mistyped_values.filter(lambda v: not isinstance(v, str)),
                                        st.text(min_size=513, max_size=600))
        options.append(mistyped_values.map(
            lambda v: (encode_message(kind, {**valid, name: v}), MSGPACK, f"{name}={str(v)[:30]}")))
    if route == "heartbeat":
        options.append(st.just((encode_message(kind, {}), MSGPACK, "missing steps_done")))
    return st.one_of(options)


def _msg(version: int, kind: str, body: Mapping[str, Any]) -> bytes:
    return bytes(msgpack.packb({"v": version, "kind": kind, "body": dict(body)}))


def _decodes(data: bytes, kind: str) -> bool:
    try:
        P.decode_control(data, MSGPACK, kind)
    except Exception:
        return False
    return True


def control_attacks(ctx: HostileContext) -> st.SearchStrategy[Hostile]:
    def build(route: str, bad: tuple[bytes, str, str]) -> Hostile:
        method, path = _route_path(route, ctx.open_a.lease_id)
        return Hostile("control", method, path, _auth(ctx.attacker, bad[1]), bad[0],
                       note=f"{route}: {bad[2]}")

    return st.sampled_from(["lease", "resume", "heartbeat", "release"]).flatmap(
        lambda r: st.builds(build, st.just(r), _bad_control_body(r)))


def path_attacks(ctx: HostileContext) -> st.SearchStrategy[Hostile]:
    a = ctx.attacker
    lease_ids = st.one_of(
        _text(1, 60).filter(lambda s: s not in (ctx.open_a.lease_id, ctx.closed_a.lease_id)),
        st.text(alphabet="abcdef0123456789-_.", min_size=129, max_size=400),
        st.sampled_from([ctx.open_v.lease_id, ctx.closed_v.lease_id, "..", ".", "%00", "a/b"]),
    )

    def on_lease(route: str, lease_id: str) -> Hostile:
        method, _ = _route_path(route, "x")
        path = f"/v1/leases/{quote(lease_id, safe='')}/{route}"
        body, ctype = _valid_body(route, ctx, LeaseInfo(lease_id, ctx.open_a.steps, ctx.open_a.base_version))
        return Hostile("path", method, path, _auth(a, ctype or MSGPACK), body,
                       note=f"{route} on {lease_id[:40]!r}")

    versions = st.one_of(st.integers(-10**6, -1).map(str), st.integers(10**6, 10**30).map(str),
                         _text(1, 30).filter(lambda s: not s.isdigit() and s != "latest"))
    model = versions.map(lambda v: Hostile("path", "GET", f"/v1/models/{quote(v, safe='')}", _auth(a),
                                           note=f"model version {v[:30]!r}"))
    unknown = st.one_of(
        st.sampled_from(["/v1", "/v1/", "/v2/leases", "/v1/leases/", "/v1/leasesx", "/v1/join/x",
                         "//v1/leases", "/v1/models", "/v1/models/", "/admin", "/v1/status/x",
                         "/v1/leases/x/y/z"]),
        _text(1, 60).map(lambda s: "/v1/x-" + quote(s, safe="/"))).map(
        lambda p: Hostile("path", "POST", p, _auth(a), encode_message("lease_request", {}),
                          note=f"path {p[:40]}"))
    wrong_method = st.sampled_from([
        ("GET", "/v1/leases"), ("DELETE", "/v1/leases"), ("PUT", "/v1/join"), ("GET", "/v1/join"),
        ("POST", "/v1/status"), ("DELETE", "/v1/status"), ("POST", "/v1/models/latest"),
        ("GET", f"/v1/leases/{ctx.open_a.lease_id}/result"), ("PATCH", "/v1/leases"),
        ("POST", f"/v1/leases/{ctx.open_a.lease_id}/result"), ("PUT", "/metrics"), ("POST", "/healthz"),
    ]).map(lambda mp: Hostile("path", mp[0], mp[1], _auth(a), note=f"{mp[0]} {mp[1]}"))
    routes = st.sampled_from(["resume", "heartbeat", "release", "result"])
    return st.one_of(st.builds(on_lease, routes, lease_ids), model, unknown, wrong_method)


def header_attacks(ctx: HostileContext) -> st.SearchStrategy[Hostile]:
    def build(kind: str, size: int) -> Hostile:
        base = _auth(ctx.attacker)
        if kind == "long":
            extra: tuple[tuple[str, str], ...] = (("X-Junk", "a" * size),)
        elif kind == "many":
            extra = tuple((f"X-H{i}", "v") for i in range(min(size, 400)))
        else:
            extra = (("Authorization2", "b" * size), ("Cookie", "c" * size))
        return Hostile("headers", "POST", "/v1/leases", base + extra,
                       encode_message("lease_request", {}), note=f"{kind} headers {size}")

    return st.builds(build, st.sampled_from(["long", "many", "cookie"]), st.integers(8200, 70000))


# -- results ------------------------------------------------------------------------------------------

_META_MUTATIONS: Final[list[tuple[str, Callable[[LeaseInfo], Any]]]] = [
    ("lease_id", lambda x: x.lease_id + "x"), ("lease_id", lambda x: None), ("lease_id", lambda x: 7),
    ("kind", lambda x: "weights!"), ("kind", lambda x: None), ("kind", lambda x: 3),
    ("base_version", lambda x: -1), ("base_version", lambda x: 10**9), ("base_version", lambda x: "0"),
    ("base_version", lambda x: 1.5), ("base_version", lambda x: None), ("base_version", lambda x: True),
    ("steps", lambda x: 0), ("steps", lambda x: -3), ("steps", lambda x: x.steps + 1),
    ("steps", lambda x: 10**12), ("steps", lambda x: "1"), ("steps", lambda x: None),
    ("steps", lambda x: 2.0), ("samples", lambda x: -1), ("samples", lambda x: "many"),
    ("partial", lambda x: "yes"), ("partial", lambda x: 1), ("metrics", lambda x: [1, 2]),
    ("metrics", lambda x: {"loss": math.nan}), ("metrics", lambda x: {"loss": math.inf}),
    ("metrics", lambda x: {f"m{i}": 1.0 for i in range(65)}), ("metrics", lambda x: {"x" * 200: 1.0}),
    ("metrics", lambda x: {"loss": "low"}), ("metrics", lambda x: {"loss": True}),
]

_TENSOR_OPS: Final = ("drop", "extra", "rename", "reshape", "flatten", "float64", "int32", "float16",
                      "nan", "inf", "-inf", "bool")


def _mutate_tensors(model: ModelState, op: str, which: int, elem: int) -> dict[str, torch.Tensor]:
    names = list(model)
    name = names[which % len(names)]
    out = {k: torch.full_like(v, 1e-3) if v.is_floating_point() else v.clone() for k, v in model.items()}
    t = out[name]
    if op == "drop":
        del out[name]
    elif op == "extra":
        out[name + ".extra"] = torch.zeros(3)
    elif op == "rename":
        out = {(k + "_" if k == name else k): v for k, v in out.items()}
    elif op == "reshape":
        out[name] = torch.zeros(t.numel() + 1, dtype=t.dtype)
    elif op == "flatten":
        out[name] = t.reshape(-1, 1) if t.dim() != 2 or t.shape[1] != 1 else t.reshape(-1)
    elif op in ("float64", "int32", "float16", "bool"):
        out[name] = t.to(getattr(torch, op))
    else:
        value = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}[op]
        t.view(-1)[elem % t.numel()] = value
    return out


def result_attacks(ctx: HostileContext) -> st.SearchStrategy[Hostile]:
    lease = ctx.open_a
    good = HP.valid_result(ctx.model, lease.lease_id, lease.base_version, steps=lease.steps)
    meta = HP.result_meta(lease.lease_id, lease.base_version, steps=lease.steps)
    path = f"/v1/leases/{lease.lease_id}/result"

    def put(body: bytes, note: str, ctype: str = PAYLOAD) -> Hostile:
        return Hostile("result", "PUT", path, _auth(ctx.attacker, ctype), body, note=note)

    def meta_mut(i: int) -> Hostile:
        name, fn = _META_MUTATIONS[i % len(_META_MUTATIONS)]
        m = {**meta, name: fn(lease)}
        if m[name] is None:
            del m[name]
        return put(HP.valid_result(ctx.model, lease.lease_id, lease.base_version, steps=lease.steps,
                                   meta=m), f"meta {name}={str(m.get(name))[:30]}")

    def tensor_mut(op: str, which: int, elem: int) -> Hostile:
        return put(HP.valid_result(ctx.model, lease.lease_id, lease.base_version, steps=lease.steps,
                                   tensors=_mutate_tensors(ctx.model, op, which, elem)), f"tensor {op}")

    def crafted(kind: str, n: int) -> Hostile:
        sections = [HP.raw_section(k, v) for k, v in ctx.model.items()]
        name, first = next(iter(ctx.model.items()))
        rest = sections[1:]
        shapes = {"overflow": [2**62, 2**62], "negative": [-1, *first.shape[1:]], "huge": [2**31 + n],
                  "dims": [1] * (17 + n % 8), "float": [1.5], "nested": [[1]], "str": ["8"]}
        if kind in shapes:
            sec = HP.tensor_frame(name, "float32", shapes[kind])
            return put(HP.crafted_payload(meta, [sec, *rest]), f"declared shape {kind}")
        if kind == "dtype":
            bad = ["object", "float128", "complex64", "str", "", "float32 ", "qint8", 7][n % 8]
            return put(HP.crafted_payload(meta, [HP.tensor_frame(name, bad, list(first.shape)), *rest]),
                       f"dtype {bad!r}")
        if kind == "codec":
            bad_codec = ["lz4", "zstd2", "", "raw "][n % 4]
            sec = HP.tensor_frame(name, "float32", list(first.shape), codec=bad_codec)
            return put(HP.crafted_payload(meta, [sec, *rest]), f"codec {bad_codec!r}")
        if kind == "count":
            return put(HP.crafted_payload(meta, sections, count=len(sections) + 1 + n % 3), "count lies")
        if kind == "end":
            return put(HP.crafted_payload(meta, sections, end_count=n % 5 + len(sections) + 1), "end lies")
        if kind == "version":
            return put(HP.crafted_payload(meta, sections, version=2 + n), "payload version")
        if kind == "magic":
            return put(b"VCAX" + good[4:], "magic")
        if kind == "header1tb":
            return put(HP.MAGIC + HP.frame(b"\x80", declared_len=0xFFFFFFFF), "header length 4 GiB")
        if kind == "rawlen":
            sec = HP.tensor_frame(name, "float32", list(first.shape)) + HP.block(0xFFFFFFFF, b"\x00" * 16)
            return put(HP.crafted_payload(meta, [sec, *rest]), "block raw_len 4 GiB")
        if kind == "bomb":
            return put(HP.bomb_payload(meta, ctx.model, inflate_to=(64 + 64 * (n % 4)) << 20),
                       "zstd decompression bomb")
        return put(good + b"\x00" * (1 + n % 64), "trailing bytes")

    kinds = st.sampled_from(["overflow", "negative", "huge", "dims", "float", "nested", "str", "dtype",
                             "codec", "count", "end", "version", "magic", "header1tb", "rawlen", "bomb",
                             "trailer"])
    return st.one_of(
        st.binary(min_size=0, max_size=4096).map(lambda b: put(b, f"random {len(b)} bytes")),
        st.integers(0, len(good) - 1).map(lambda i: put(good[:i], f"truncated at {i}")),
        st.tuples(st.integers(0, len(good) - 1), st.integers(1, 255)).map(
            lambda t: put(good[:t[0]] + bytes([good[t[0]] ^ t[1]]) + good[t[0] + 1:],
                          f"byte {t[0]} ^ {t[1]}")),
        st.integers(0, len(good) - 1).map(lambda i: put(good[:i] + good[i + 1:], f"byte {i} deleted")),
        st.tuples(st.integers(0, len(good)), st.binary(min_size=1, max_size=8)).map(
            lambda t: put(good[:t[0]] + t[1] + good[t[0]:], f"{len(t[1])} bytes inserted at {t[0]}")),
        st.integers(0, 10**6).map(meta_mut),
        st.builds(tensor_mut, st.sampled_from(_TENSOR_OPS), st.integers(0, 100), st.integers(0, 10**6)),
        st.builds(crafted, kinds, st.integers(0, 1000)),
        st.sampled_from(["model", "journal", "resultx"]).map(lambda k: put(HP.valid_result(
            ctx.model, lease.lease_id, lease.base_version, steps=lease.steps, kind=k), f"payload kind {k}")),
        st.sampled_from(["text/plain", "application/json", MSGPACK, "multipart/form-data"]).map(
            lambda c: put(good, f"content type {c}", c)),
    )


def replay_attacks(ctx: HostileContext) -> st.SearchStrategy[Hostile]:
    a, v = ctx.attacker, ctx.victim

    def put(lease_id: str, token: str, body: bytes, note: str, expect: str = "refused") -> Hostile:
        return Hostile("replay", "PUT", f"/v1/leases/{lease_id}/result", _auth(token, PAYLOAD), body,
                       expect, note)

    victim_fresh = HP.valid_result(ctx.model, ctx.open_v.lease_id, ctx.open_v.base_version,
                                   steps=ctx.open_v.steps)
    attacks = [
        put(ctx.closed_v.lease_id, a, ctx.closed_v.payload, "victim's accepted result, by the attacker"),
        put(ctx.open_v.lease_id, a, victim_fresh, "a valid result for the victim's open lease"),
        put(ctx.open_a.lease_id, a, ctx.closed_v.payload, "victim's result to the attacker's lease"),
        put(ctx.open_a.lease_id, a, ctx.closed_a.payload, "an old result to a new lease"),
        put(ctx.closed_v.lease_id, v, ctx.closed_a.payload, "another result to the owner's closed lease "
            "(the lease id is the idempotency key: the first receipt again, body unread)", "duplicate"),
        put(ctx.closed_a.lease_id, a, ctx.closed_a.payload, "owner re-sends its accepted result",
            "duplicate"),
    ]
    # Indices, not the requests: a strategy's repr (printed on errors) must not hold megabytes.
    return st.integers(0, len(attacks) - 1).map(attacks.__getitem__)


def hostile_requests(ctx: HostileContext, families: tuple[str, ...] = FAMILIES) -> st.SearchStrategy[Hostile]:
    """Every family, mixed (or only ``families``)."""
    table = {"auth": auth_attacks, "join": join_attacks, "control": control_attacks, "path": path_attacks,
             "result": result_attacks, "replay": replay_attacks, "headers": header_attacks}
    return st.one_of([table[f](ctx) for f in families])
