"""Header plans are cached by their exact bytes and limits, yet every check that depends on the
payload still runs each time; group items are written by address, bool bytes still checked."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
import torch

from vcasync.errors import ChecksumError, FrameError, LimitExceededError, SpecMismatchError
from vcasync.tensors import ModelSpec, TensorSpec
from vcasync.wire import Limits, decode_payload, decode_payload_bytes, encode_payload
from vcasync.wire.frames import BLOCK, MAGIC, PROTOCOL_VERSION, checksum, frame_prefix
from vcasync.wire.headers import PLANS, FramePlan, PlanCache, frame_plan


def frame(header: dict[str, Any]) -> bytes:
    return frame_prefix(msgpack.packb(header, use_bin_type=True))


def preamble(count: int) -> bytes:
    return MAGIC + frame({"t": "P", "v": PROTOCOL_VERSION, "kind": "result", "count": count,
                          "meta": {}})


def group(items: list[list[Any]]) -> bytes:
    return frame({"t": "G", "items": items, "codec": "raw"})


def block(wire: bytes) -> bytes:
    return BLOCK.pack(len(wire), len(wire), checksum(wire)) + wire


def end(count: int) -> bytes:
    return frame({"t": "E", "count": count})


def model() -> dict[str, torch.Tensor]:
    return {"a.w": torch.randn(8, 3), "a.b": torch.randn(8), "bn.n": torch.tensor(7),
            "mask": torch.tensor([True, False, True]), "big": torch.randn(40_000),
            "h": torch.randn(5).to(torch.bfloat16)}


def test_decoding_the_same_model_twice_reuses_its_plans_and_gives_the_same_tensors() -> None:
    sd = model()
    data = b"".join(encode_payload("result", {}, sd))
    first = decode_payload_bytes(data)
    size = len(PLANS)
    out = {k: torch.full_like(v, 0) for k, v in sd.items()}
    again = decode_payload_bytes(data, out=out)
    assert len(PLANS) == size                     # every header was a hit
    for name, t in sd.items():
        assert torch.equal(first.tensors[name], t)
        assert torch.equal(again.tensors[name], t)
        assert again.tensors[name] is out[name]


def test_a_cached_group_still_meets_the_payload_checks() -> None:
    items = [["x", "float32", [2]], ["y", "int64", []]]
    body = group(items) + block(torch.tensor([1.0, 2.0]).numpy().tobytes()
                                + torch.tensor(3).numpy().tobytes())
    ok = preamble(2) + body + end(2)
    decode_payload_bytes(ok)
    decode_payload_bytes(ok)                      # the group's plan is now cached
    with pytest.raises(FrameError, match="appears twice"):
        decode_payload_bytes(preamble(4) + body + body + end(4))
    with pytest.raises(FrameError, match="more tensors than the 1 declared"):
        decode_payload_bytes(preamble(1) + body + end(1))
    spec = ModelSpec({"x": TensorSpec((2,), torch.float32), "y": TensorSpec((), torch.int32)})
    with pytest.raises(SpecMismatchError) as info:
        decode_payload_bytes(ok, spec=spec)
    assert info.value.reason == "dtype_mismatch"
    with pytest.raises(LimitExceededError, match="decoded bytes"):
        decode_payload_bytes(ok, limits=Limits(max_decoded_bytes=10))
    with pytest.raises(LimitExceededError, match="group bytes"):
        decode_payload_bytes(ok, limits=Limits(max_block_bytes=8))
    out = {"x": torch.zeros(2), "y": torch.zeros((), dtype=torch.int32)}
    with pytest.raises(SpecMismatchError) as info:
        decode_payload_bytes(ok, out=out)
    assert info.value.reason == "out_mismatch"


def test_a_changed_byte_of_a_header_is_a_different_plan() -> None:
    limits = Limits()
    a = msgpack.packb({"t": "G", "items": [["x", "float32", [2]]], "codec": "raw"})
    b = msgpack.packb({"t": "G", "items": [["x", "float32", [3]]], "codec": "raw"})
    pa, pb = frame_plan(memoryview(a), limits), frame_plan(memoryview(b), limits)
    assert isinstance(pa, FramePlan)
    assert isinstance(pb, FramePlan)
    assert pa.decls[0].shape == (2,)
    assert pb.decls[0].shape == (3,)
    assert frame_plan(memoryview(a), Limits(max_dims=4)) is not pa     # other limits, other key
    with pytest.raises(LimitExceededError, match="tensor dims"):
        frame_plan(memoryview(a), Limits(max_dims=0))


def test_a_bool_tensor_holding_other_bytes_is_refused_in_a_group_and_alone() -> None:
    bad = bytes([1, 0, 2])
    with pytest.raises(FrameError, match="bool tensor 'm' holds bytes other than 0 and 1"):
        decode_payload_bytes(preamble(2) + group([["m", "bool", [3]], ["k", "uint8", [1]]])
                             + block(bad + b"\x05") + end(2))
    header = frame({"t": "T", "name": "m", "dtype": "bool", "shape": [3], "codec": "raw",
                    "shuffle": False})
    with pytest.raises(FrameError, match="bool tensor 'm'"):
        decode_payload_bytes(preamble(1) + header + block(bad) + end(1))


def test_a_group_of_one_must_come_in_one_block() -> None:
    n = 5000
    payload = torch.arange(n, dtype=torch.uint8).numpy().tobytes()
    whole = preamble(1) + group([["g", "uint8", [n]]]) + block(payload) + end(1)
    assert torch.equal(decode_payload_bytes(whole).tensors["g"], torch.arange(n, dtype=torch.uint8))
    split = (preamble(1) + group([["g", "uint8", [n]]]) + block(payload[:4096])
             + block(payload[4096:]) + end(1))
    with pytest.raises(FrameError, match="one block"):
        decode_payload_bytes(split)


def test_conjugate_views_travel_as_their_values_and_are_refused_as_out_buffers() -> None:
    z = torch.tensor([1 + 2j, 3 - 1j], dtype=torch.complex64).conj()
    neg = torch.tensor([1 + 1j], dtype=torch.complex128).conj().imag   # a negative view
    got = decode_payload_bytes(b"".join(encode_payload("result", {}, {"z": z, "n": neg})))
    assert torch.equal(got.tensors["z"], z.resolve_conj())
    assert torch.equal(got.tensors["n"], neg.resolve_neg())
    data = b"".join(encode_payload("result", {}, {"z": z.resolve_conj()}))
    with pytest.raises(SpecMismatchError) as info:
        decode_payload_bytes(data, out={"z": torch.zeros(2, dtype=torch.complex64).conj()})
    assert info.value.reason == "out_mismatch"
    data = b"".join(encode_payload("result", {}, {"n": neg.resolve_neg()}))
    with pytest.raises(SpecMismatchError) as info:
        decode_payload_bytes(data, out={"n": neg})
    assert info.value.reason == "out_mismatch"


def test_the_plan_cache_stays_within_its_bounds() -> None:
    limits = Limits()

    def key(i: int, n: int = 1) -> tuple[bytes, Limits]:
        items = [[f"t{i}.{j}", "float32", [1]] for j in range(n)]
        return msgpack.packb({"t": "G", "items": items, "codec": "raw"}), limits

    def plan_of(k: tuple[bytes, Limits]) -> FramePlan:
        p = frame_plan(memoryview(k[0]), limits, PlanCache())
        assert p is not None
        return p

    cache = PlanCache(max_entries=3, max_key_bytes=1 << 20, max_tensors=1 << 10)
    for i in range(5):
        cache.put(key(i), plan_of(key(i)))
    assert len(cache) == 3
    assert cache.get(key(0)) is None
    assert cache.get(key(4)) is not None
    cache.get(key(2))                              # used: the least recent is now key(3)
    cache.put(key(5), plan_of(key(5)))
    assert cache.get(key(3)) is None
    assert cache.get(key(2)) is not None

    by_tensors = PlanCache(max_tensors=10)
    for i in range(4):
        by_tensors.put(key(i, 4), plan_of(key(i, 4)))
    assert len(by_tensors) == 2                    # 4 + 4 tensors fit, a third 4 does not

    k = key(0, 3)
    by_bytes = PlanCache(max_key_bytes=2 * len(k[0]))
    for i in range(4):
        by_bytes.put(key(i, 3), plan_of(key(i, 3)))
    assert len(by_bytes) == 2

    long = PlanCache(max_header_bytes=len(k[0]) - 1)
    long.put(k, plan_of(k))
    assert len(long) == 0



def test_small_tensors_travel_first_yet_come_out_in_the_models_order() -> None:
    sd = {"conv1.w": torch.randn(64, 3, 7, 7), "bn1.w": torch.randn(64), "bn1.n": torch.tensor(3),
          "fc.w": torch.randn(100, 200), "fc.b": torch.randn(100), "mask": torch.tensor([True])}
    data = b"".join(encode_payload("model", {}, sd, chunk_size=8192))
    got = decode_payload_bytes(data)
    assert list(got.tensors) == list(sd)
    for name, t in sd.items():
        assert torch.equal(got.tensors[name], t)
    first = data.index(b"bn1.w")
    assert first < data.index(b"conv1.w")
    assert data.index(b"fc.b") < data.index(b"fc.w")


def test_a_group_without_places_keeps_the_order_it_came_in() -> None:
    x, y = torch.tensor([1.0, 2.0]), torch.tensor(3)
    body = group([["x", "float32", [2]], ["y", "int64", []]]) + block(
        x.numpy().tobytes() + y.numpy().tobytes())
    got = decode_payload_bytes(preamble(2) + body + end(2))
    assert list(got.tensors) == ["x", "y"]


@pytest.mark.parametrize(("at", "count", "message"), [
    ([0], 2, "list of 2 places"), ("01", 2, "list of 2 places"), ([0, -1], 2, "non-negative"),
    ([0, True], 2, "non-negative ints"), ([1, 1], 2, "repeat"), ([0, 2], 2, "out of 0..1"),
])
def test_group_places_that_lie_are_refused(at: Any, count: int, message: str) -> None:
    payload = torch.tensor([1.0, 2.0]).numpy().tobytes() + torch.tensor(3).numpy().tobytes()
    header = frame({"t": "G", "items": [["x", "float32", [2]], ["y", "int64", []]],
                    "codec": "raw", "at": at})
    with pytest.raises(FrameError, match=message):
        decode_payload_bytes(preamble(count) + header + block(payload) + end(count))


def test_two_groups_cannot_claim_the_same_place() -> None:
    def one(name: str, at: int) -> bytes:
        return frame({"t": "G", "items": [[name, "int64", []]], "codec": "raw", "at": [at]}) \
            + block(torch.tensor(1).numpy().tobytes())
    assert list(decode_payload_bytes(preamble(2) + one("a", 1) + one("b", 0) + end(2)).tensors) \
        == ["b", "a"]
    with pytest.raises(FrameError, match="taken"):
        decode_payload_bytes(preamble(2) + one("a", 0) + one("b", 0) + end(2))


async def test_a_source_failing_while_a_batch_decodes_raises_its_own_error() -> None:
    data = b"".join(encode_payload("result", {}, {"w": torch.randn(3_000_000)}))   # 12 MB
    fed = 0

    async def chunks() -> Any:
        nonlocal fed
        for i in range(0, len(data), 1 << 20):
            if fed >= 9 << 20:
                raise ConnectionResetError("peer went away")
            fed += 1 << 20
            yield data[i:i + (1 << 20)]

    with pytest.raises(ConnectionResetError, match="peer went away"):
        await decode_payload(chunks())


async def test_a_bad_batch_stops_the_stream_with_a_wire_error() -> None:
    data = bytearray(b"".join(encode_payload("result", {}, {"w": torch.randn(3_000_000)})))
    data[2 << 20] ^= 0xFF                        # inside the first 4 MiB batch
    read = 0

    async def chunks() -> Any:
        nonlocal read
        for i in range(0, len(data), 1 << 20):
            read += 1
            yield bytes(data[i:i + (1 << 20)])

    with pytest.raises(ChecksumError):
        await decode_payload(chunks())
    assert read < len(data) >> 20               # refused before the whole body was read
