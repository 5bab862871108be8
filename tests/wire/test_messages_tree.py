"""Control messages and pack_tree: round trips and rejections."""

from __future__ import annotations

import contextlib
import math
from typing import Any

import msgpack
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vcasync.errors import FrameError, LimitExceededError, ProtocolVersionError, WireError
from vcasync.wire import Limits, decode_message, encode_message, pack_tree, unpack_tree
from vcasync.wire.dtypes import as_bytes
from vcasync.wire.frames import MAGIC, PROTOCOL_VERSION, frame_prefix

SETTINGS = settings(deadline=None, max_examples=150, suppress_health_check=[HealthCheck.too_slow])

scalars = (st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats()
           | st.text(max_size=20) | st.binary(max_size=20))
plain = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                     | st.dictionaries(st.text(max_size=6), inner, max_size=4), max_leaves=20)


def _tensor(dtype: torch.dtype, shape: list[int], seed: int) -> torch.Tensor:
    n = int(np.prod(shape))
    if n == 0:
        return torch.empty(shape, dtype=dtype)
    raw = np.random.default_rng(seed).integers(0, 2, n * dtype.itemsize, dtype=np.uint8)
    return torch.from_numpy(raw).view(dtype).reshape(shape)


def small_tensors() -> st.SearchStrategy[torch.Tensor]:
    return st.builds(
        _tensor,
        st.sampled_from([torch.float32, torch.float64, torch.int64, torch.bfloat16, torch.bool,
                         torch.uint8, torch.float16]),
        st.lists(st.integers(0, 4), max_size=3), st.integers(0, 2**32 - 1))


trees = st.recursive(scalars | small_tensors(),
                     lambda inner: st.lists(inner, max_size=4) | st.tuples(inner, inner)
                     | st.dictionaries(st.text(max_size=6), inner, max_size=4), max_leaves=20)


def same(a: Any, b: Any) -> bool:
    """Structural, bit-exact equality (NaN equals NaN with the same bits; types must match)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        return (a.dtype == b.dtype and a.shape == b.shape
                and as_bytes(a.contiguous()).tobytes() == as_bytes(b.contiguous()).tobytes())
    if isinstance(a, float):
        return math.copysign(1, a) == math.copysign(1, b) and (a == b or (a != a and b != b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


# --- control messages -------------------------------------------------------------------------

@SETTINGS
@given(kind=st.text(min_size=1, max_size=30), body=st.dictionaries(st.text(max_size=8), plain, max_size=5))
def test_message_round_trip(kind: str, body: dict[str, Any]) -> None:
    msg = decode_message(encode_message(kind, body), expected_kind=kind)
    assert msg.kind == kind
    assert same(msg.body, body)


@SETTINGS
@given(st.binary(max_size=500))
def test_random_bytes_are_wire_errors(data: bytes) -> None:
    with contextlib.suppress(WireError):
        decode_message(data)


def test_message_truncations_and_mutations_raise_wire_errors_only() -> None:
    data = encode_message("heartbeat", {"lease_id": "abc", "steps": 12, "x": [1.5, None, b"\0"]})
    for cut in range(len(data)):
        with pytest.raises(WireError):
            decode_message(data[:cut])
    for pos in range(len(data)):
        for flip in (1, 0x80, 0xFF):
            m = bytearray(data)
            m[pos] ^= flip
            with contextlib.suppress(WireError):
                decode_message(bytes(m))


@pytest.mark.parametrize(("obj", "error", "match"), [
    ({"v": 2, "kind": "x", "body": {}}, ProtocolVersionError, "version 2"),
    ({"kind": "x", "body": {}}, ProtocolVersionError, "version None"),
    ({"v": 1, "kind": "x", "body": {}, "more": 1}, FrameError, "keys"),
    ({"v": 1, "kind": 3, "body": {}}, FrameError, "kind"),
    ({"v": 1, "kind": "x", "body": [1]}, FrameError, "body"),
    ([1, "x", {}], FrameError, "map"),
    ({"v": 1, "kind": "x", "body": {1: 2}}, FrameError, "msgpack"),
    ({"v": 1, "kind": "x", "body": {"a": msgpack.ExtType(3, b"x")}}, FrameError, "ext"),
])
def test_message_rejections(obj: Any, error: type[WireError], match: str) -> None:
    with pytest.raises(error, match=match):
        decode_message(msgpack.packb(obj))


def test_message_limits() -> None:
    big = encode_message("x", {"blob": b"\0" * 5000})
    with pytest.raises(LimitExceededError, match="over the limit 1000") as info:
        decode_message(big, limits=Limits(max_meta_bytes=1000))
    assert info.value.field == "message"
    deep: Any = 1
    for _ in range(40):
        deep = [deep]
    with pytest.raises(LimitExceededError, match="deeper"):
        decode_message(encode_message("x", {"d": deep}))
    with pytest.raises(FrameError, match="msgpack"):
        decode_message(encode_message("x", {"l": list(range(20))}), limits=Limits(max_items=10))
    with pytest.raises(FrameError, match="expected a 'lease'"):
        decode_message(encode_message("x"), expected_kind="lease")
    with pytest.raises(FrameError, match="msgpack"):
        decode_message(msgpack.packb({"v": 1, "kind": "x", "body": {}}) + b"\0")
    with pytest.raises(FrameError, match="msgpack"):
        decode_message(b"\xa2\xff\xfe")                  # invalid UTF-8 in a str
    with pytest.raises(TypeError):
        encode_message("x", {"o": object()})


# --- pack_tree --------------------------------------------------------------------------------

@SETTINGS
@given(trees)
def test_tree_round_trip_is_bit_exact(tree: Any) -> None:
    assert same(unpack_tree(pack_tree(tree)), tree)


def test_policy_state_like_tree() -> None:
    state = {"momentum": {"w": torch.randn(3, 4), "b": torch.zeros(4)}, "step": 12,
             "buffer": [(torch.ones(2), 0.5, "w1")], "nan": float("nan"), "neg0": -0.0,
             "flags": torch.tensor([True, False]), "big": 2**64 - 1, "none": None}
    got = unpack_tree(pack_tree(state, codec="zstd"))
    assert same(got, state)
    assert isinstance(got["buffer"][0], tuple)


@pytest.mark.parametrize(("obj", "match"), [
    ({1: 2}, "keys must be str"), ({"x": object()}, "cannot pack"), ({"x": 2**64}, "64 bits"),
    ({"x": {1.5}}, "cannot pack"),
])
def test_pack_tree_refuses_what_it_cannot_round_trip(obj: Any, match: str) -> None:
    with pytest.raises(TypeError, match=match):
        pack_tree(obj)


def test_columns_of_plain_values_pack_as_they_are_and_keep_every_check() -> None:
    """Flat lists of scalars skip the item-by-item walk (a ledger snapshot is such columns);
    what the walk refused is still refused, and named."""
    import enum

    class Colour(enum.StrEnum):
        RED = "red"

    cols = {"ids": [f"u{i}" for i in range(1000)], "n": list(range(1000)), "x": [0.5, None, True],
            "s": [Colour.RED, "blue"], "mixed": [1, "a", [2, (3,)], b"z"], "empty": []}
    assert unpack_tree(pack_tree(cols)) == {**cols, "s": ["red", "blue"]}
    with pytest.raises(TypeError, match=r"tree\.n: int 18446744073709551616 does not fit"):
        pack_tree({"n": [1, None, 2**64]})
    with pytest.raises(TypeError, match="does not fit"):
        pack_tree({"n": [-(2**63) - 1]})
    assert unpack_tree(pack_tree({"n": [-(2**63), 2**64 - 1]})) == {"n": [-(2**63), 2**64 - 1]}
    # a flat list at the depth limit: its items are one level too deep, as they were walked
    from vcasync.wire._msgpack import check_plain
    check_plain([1, 2], Limits(max_depth=1), field="f")
    for flat in ([[1, 2]], [["a", None]], [[{"k": 1}]]):
        with pytest.raises(LimitExceededError, match="deeper"):
            check_plain(flat, Limits(max_depth=1), field="f")


def _tree_payload(meta: Any, tensors: int = 0) -> bytes:
    from vcasync.wire.encoder import iter_payload
    from vcasync.wire.plan import CodecSpec
    return b"".join(iter_payload("tree", meta, {str(i): torch.zeros(1) for i in range(tensors)},
                                 CodecSpec(), 1 << 16, False))


@pytest.mark.parametrize(("data", "match"), [
    (_tree_payload({"tree": msgpack.ExtType(1, b"\0\0\0\0")}), "unknown or used twice"),
    (_tree_payload({"tree": [msgpack.ExtType(1, b"\0\0\0\0")] * 2}, 1), "used twice"),
    (_tree_payload({"tree": 1}, 1), "never referenced"),
    (_tree_payload({"tree": msgpack.ExtType(1, b"\0")}), "4 bytes"),
    (_tree_payload({"tree": msgpack.ExtType(9, b"")}), "ext type 9"),
    (_tree_payload({"tree": msgpack.ExtType(2, msgpack.packb({"a": 1}))}), "list"),
    (_tree_payload({"tree": 1, "x": 2}), "exactly 'tree'"),
])
def test_unpack_tree_rejections(data: bytes, match: str) -> None:
    with pytest.raises(WireError, match=match):
        unpack_tree(data)


def test_unpack_tree_bounds_tuple_nesting() -> None:
    deep: Any = 1
    for _ in range(40):
        deep = (deep,)
    with pytest.raises(LimitExceededError, match="deeper"):
        unpack_tree(pack_tree(deep))
    assert same(unpack_tree(pack_tree(deep), limits=Limits(max_depth=64)), deep)


def test_unpack_tree_truncations_and_mutations() -> None:
    data = pack_tree({"a": (torch.arange(3), 1.5), "b": [torch.ones(2, dtype=torch.bool)]})
    for cut in range(len(data)):
        with pytest.raises(WireError):
            unpack_tree(data[:cut])
    for pos in range(len(data)):
        m = bytearray(data)
        m[pos] ^= 0x41
        with pytest.raises(WireError):
            unpack_tree(bytes(m))


def test_an_ordinary_payload_is_not_a_tree() -> None:
    data = MAGIC + frame_prefix(msgpack.packb({"t": "P", "v": PROTOCOL_VERSION, "kind": "model",
                                              "count": 0, "meta": {}}))
    with pytest.raises(FrameError, match="expected a 'tree' payload"):
        unpack_tree(data)
