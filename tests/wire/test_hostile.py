"""Hostile input: random bytes, truncations, mutations, lying sizes and zstd bombs only ever raise
WireError subclasses, and nothing big is allocated before a declared size passed its limit."""

from __future__ import annotations

import struct
import tracemalloc
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

import msgpack
import pytest
import torch
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vcasync.errors import (
    ChecksumError,
    FrameError,
    LimitExceededError,
    ProtocolVersionError,
    SpecMismatchError,
    UnsupportedDtypeError,
    WireError,
)
from vcasync.tensors import ModelSpec, TensorSpec
from vcasync.wire import Limits, PayloadDecoder, decode_payload_bytes, encode_payload
from vcasync.wire.codecs import block_codec
from vcasync.wire.frames import BLOCK, MAGIC, PROTOCOL_VERSION, checksum, frame_prefix

SETTINGS = settings(deadline=None, max_examples=200, suppress_health_check=[HealthCheck.too_slow])
TB = 1 << 40


def frame(header: dict[str, Any]) -> bytes:
    return frame_prefix(msgpack.packb(header, use_bin_type=True))


def preamble(count: int, kind: str = "result", meta: dict[str, Any] | None = None, **extra: Any) -> bytes:
    return MAGIC + frame({"t": "P", "v": PROTOCOL_VERSION, "kind": kind, "count": count,
                          "meta": meta or {}, **extra})


def theader(name: str = "w", dtype: str = "float32", shape: list[int] | None = None,
            codec: str = "raw", shuffle: bool = False, **extra: Any) -> bytes:
    return frame({"t": "T", "name": name, "dtype": dtype, "shape": [4] if shape is None else shape,
                  "codec": codec, "shuffle": shuffle, **extra})


def group(items: Any, codec: str = "raw", **extra: Any) -> bytes:
    return frame({"t": "G", "items": items, "codec": codec, **extra})


def block(wire: bytes, raw_len: int | None = None) -> bytes:
    return BLOCK.pack(len(wire) if raw_len is None else raw_len, len(wire), checksum(wire)) + wire


def end(count: int) -> bytes:
    return frame({"t": "E", "count": count})


def valid_messages() -> list[bytes]:
    sd = {"conv.w": torch.randn(4, 3, 3), "bn.n": torch.tensor(5), "mask": torch.tensor([True, False]),
          "e": torch.empty(0, 2), "h": torch.randn(300).to(torch.bfloat16)}
    return [b"".join(encode_payload("result", {"steps": 2, "m": [1.5, "x"]}, sd, codec=c,
                                    chunk_size=4096))
            for c in ("raw", "zstd", "bf16")]


VALID = valid_messages()


@contextmanager
def no_big_allocation(limit: int = 64 << 20) -> Iterator[None]:
    """Fails if torch.empty is asked for more than ``limit`` bytes or Python allocates that much."""
    real_empty = torch.empty

    def guarded_empty(*shape: Any, **kw: Any) -> torch.Tensor:
        t = real_empty(0, dtype=kw.get("dtype"))
        dims = shape[0] if len(shape) == 1 and isinstance(shape[0], tuple | list) else shape
        n = 1
        for d in dims:
            n *= int(d)
        assert n * t.element_size() <= limit, f"torch.empty asked for {n * t.element_size()} bytes"
        return real_empty(*shape, **kw)

    tracemalloc.start()
    try:
        with mock.patch("torch.empty", guarded_empty):
            yield
        _, peak = tracemalloc.get_traced_memory()
        assert peak < limit, f"Python allocated {peak} bytes"
    finally:
        tracemalloc.stop()


# --- anything malformed raises a WireError, and only that -------------------------------------

@SETTINGS
@given(st.binary(max_size=2000))
def test_random_bytes_raise_wire_errors_only(data: bytes) -> None:
    with pytest.raises(WireError):
        decode_payload_bytes(data)
    with pytest.raises(WireError):
        decode_payload_bytes(MAGIC + data)


@pytest.mark.parametrize("index", range(len(VALID)))
def test_every_truncation_raises_a_frame_error(index: int) -> None:
    data = VALID[index]
    decode_payload_bytes(data)
    for cut in range(len(data)):
        with pytest.raises(FrameError):
            decode_payload_bytes(data[:cut])


@pytest.mark.parametrize("index", range(len(VALID)))
def test_every_single_byte_mutation_is_detected(index: int) -> None:
    data = VALID[index]
    for pos in range(len(data)):
        for flip in (0x01, 0x80, 0xFF):
            mutated = bytearray(data)
            mutated[pos] ^= flip
            with pytest.raises(WireError):
                decode_payload_bytes(bytes(mutated))


@SETTINGS
@given(index=st.integers(0, len(VALID) - 1), edits=st.lists(st.tuples(st.integers(0, 10**6),
                                                                      st.integers(0, 255)),
                                                            min_size=1, max_size=8),
       chunk=st.integers(1, 300))
def test_random_edits_streamed_raise_wire_errors_only(index: int, edits: list[tuple[int, int]],
                                                      chunk: int) -> None:
    data = bytearray(VALID[index])
    for pos, value in edits:
        data[pos % len(data)] = value
    dec = PayloadDecoder()
    try:
        for i in range(0, len(data), chunk):
            dec.feed(bytes(data[i:i + chunk]))
        dec.finish()
    except WireError:
        pass


def test_bytes_after_the_end_frame_are_refused() -> None:
    with pytest.raises(FrameError, match="after the end frame"):
        decode_payload_bytes(VALID[0] + b"\0")


def test_a_failed_decoder_refuses_more_input() -> None:
    dec = PayloadDecoder()
    with pytest.raises(FrameError):
        dec.feed(b"nope")
    with pytest.raises(FrameError):
        dec.feed(VALID[0])
    with pytest.raises(FrameError):
        dec.finish()


# --- declared sizes are checked before anything is allocated ----------------------------------

def test_a_1_tb_tensor_fails_fast_without_allocating() -> None:
    data = preamble(1) + theader(shape=[TB // 4]) + block(b"\0" * 16)
    with no_big_allocation(), pytest.raises(LimitExceededError) as info:
        decode_payload_bytes(data)
    assert info.value.field in ("tensor dim", "tensor elements")
    assert str(1 << 31) in str(info.value)
    generous = Limits(max_elements=1 << 60, max_tensor_bytes=1 << 50)
    with no_big_allocation(), pytest.raises(LimitExceededError) as info2:
        decode_payload_bytes(data, limits=generous)
    assert info2.value.field == "decoded bytes"
    assert "max_decoded_bytes" in str(info2.value)


def test_a_tensor_that_does_not_fit_the_spec_is_refused_before_allocation() -> None:
    spec = ModelSpec({"w": TensorSpec((4,), torch.float32)})
    limits = Limits(max_elements=1 << 60, max_tensor_bytes=1 << 50, max_decoded_bytes=1 << 50)
    data = preamble(1) + theader(shape=[TB // 4])
    with no_big_allocation(), pytest.raises(SpecMismatchError) as info:
        decode_payload_bytes(data, limits=limits, spec=spec)
    assert info.value.reason == "shape_mismatch"
    for bad, reason in ((theader(name="x"), "unknown_tensor"), (theader(dtype="float64"), "dtype_mismatch")):
        with pytest.raises(SpecMismatchError) as info:
            decode_payload_bytes(preamble(1) + bad, spec=spec)
        assert info.value.reason == reason
    with pytest.raises(SpecMismatchError) as info:
        decode_payload_bytes(preamble(0) + end(0), spec=spec)
    assert info.value.reason == "missing_tensor"
    with no_big_allocation(), pytest.raises(SpecMismatchError) as info:
        decode_payload_bytes(preamble(2, ) + group([["w", "float32", [4]], ["x", "float32", [TB]]]),
                             spec=spec, limits=limits)
    assert info.value.reason == "unknown_tensor"


def test_a_header_length_of_4_gib_is_refused_before_buffering() -> None:
    data = MAGIC + struct.pack("<II", 0xFFFFFFFF, 0) + b"x" * 100
    with no_big_allocation(), pytest.raises(LimitExceededError, match="frame header bytes"):
        decode_payload_bytes(data)


def test_tiny_blocks_cannot_make_decoding_crawl() -> None:
    data = preamble(1) + theader(shape=[4096]) + block(b"\0" * 4)
    with pytest.raises(FrameError, match="too small"):
        decode_payload_bytes(data)
    last = preamble(1) + theader(shape=[1021]) + block(b"\0" * 4080) + block(b"\0" * 4) + end(1)
    assert decode_payload_bytes(last).tensors["w"].shape == (1021,)


def test_a_block_larger_than_its_tensor_is_refused() -> None:
    data = preamble(1) + theader(shape=[4]) + BLOCK.pack(1 << 30, 1 << 30, 0)
    with no_big_allocation(), pytest.raises(LimitExceededError, match="block bytes"):
        decode_payload_bytes(data)


@pytest.mark.parametrize(("limits", "data", "field"), [
    (Limits(max_message_bytes=100), VALID[0], "message bytes"),
    (Limits(max_tensors=2), VALID[0], "tensor count"),
    (Limits(max_dims=2), VALID[0], "tensor dims"),
    (Limits(max_elements=10), VALID[0], "tensor elements"),
    (Limits(max_tensor_bytes=100), VALID[0], "tensor bytes"),
    (Limits(max_decoded_bytes=100), VALID[0], "decoded bytes"),
    (Limits(max_name_bytes=3), b"".join(encode_payload("r", {}, {"long": torch.zeros(1)})),
     "tensor name bytes"),
    (Limits(max_name_bytes=3), preamble(0, kind="x" * 10) + end(0), "kind bytes"),
    (Limits(max_meta_bytes=10, max_header_bytes=10), VALID[0], "frame header bytes"),
    (Limits(max_header_bytes=20), VALID[0], "frame header bytes"),
    (Limits(max_block_bytes=100), VALID[0], "group bytes"),
    (Limits(max_block_bytes=5000), b"".join(encode_payload("r", {}, {"w": torch.zeros(10_000)})),
     "block bytes"),
    (Limits(max_items=1), VALID[0], "preamble"),
])
def test_each_limit_names_its_field_and_value(limits: Limits, data: bytes, field: str) -> None:
    with pytest.raises(WireError) as info:
        decode_payload_bytes(data, limits=limits)
    assert info.value.field == field or (info.value.field or "").startswith(field)


def test_the_dtype_and_codec_allow_lists() -> None:
    with pytest.raises(UnsupportedDtypeError, match="allow-list"):
        decode_payload_bytes(VALID[0], limits=Limits(allowed_dtypes=frozenset({"float32"})))
    with pytest.raises(UnsupportedDtypeError, match="codec"):
        decode_payload_bytes(VALID[1], limits=Limits(allowed_codecs=frozenset({"raw"})))
    for dtype in ("qint8", "object", "torch.float32", 7):
        with pytest.raises(UnsupportedDtypeError):
            decode_payload_bytes(preamble(1) + theader(dtype=dtype))
    with pytest.raises(UnsupportedDtypeError):
        decode_payload_bytes(preamble(1) + theader(codec="pickle"))


# --- zstd bombs -------------------------------------------------------------------------------

def rle_frame(total: int, declared: int | None) -> bytes:
    """A zstd frame of RLE blocks expanding to ``total`` zero bytes (128 KiB per 4-byte block),
    declaring ``declared`` as its content size (None: no content size)."""
    out = bytearray(struct.pack("<I", 0xFD2FB528))
    if declared is None:
        out += bytes([0x00, 0x38])                       # no FCS, window descriptor 128 KiB
    else:
        out += bytes([0xC0, 0x38]) + struct.pack("<Q", declared)   # 8-byte FCS
    size = 1 << 17
    blocks, rest = divmod(total, size)
    sizes = [size] * blocks + ([rest] if rest else [])
    for i, s in enumerate(sizes):
        last = 1 if i == len(sizes) - 1 else 0
        out += (last | (1 << 1) | (s << 3)).to_bytes(3, "little") + b"\0"
    return bytes(out)


def test_the_rle_bomb_is_a_real_zstd_frame() -> None:
    small = rle_frame(1 << 20, None)
    assert zstandard.ZstdDecompressor().decompress(small, max_output_size=1 << 21) == b"\0" * (1 << 20)


@pytest.mark.parametrize(("declared", "error", "match"), [
    (None, FrameError, "content size"),                   # no declared size: refused outright
    (10 << 30, LimitExceededError, "declares"),           # declares 10 GB: refused before work
    (4 << 20, FrameError, "corrupt"),                     # lies small: output stops at 4 MiB
])
def test_a_10_gb_zstd_bomb_stops_at_the_limit(declared: int | None, error: type[WireError],
                                              match: str) -> None:
    bomb = rle_frame(10 << 30, declared)                  # ~320 KB that expand to 10 GB
    raw_len = 4 << 20                                     # the block's checked size: 4 MiB
    data = preamble(1) + theader(shape=[1 << 20], codec="zstd") + block(bomb, raw_len) + end(1)
    with no_big_allocation(), pytest.raises(error, match=match):
        decode_payload_bytes(data)
    with no_big_allocation(), pytest.raises(error, match=match):
        block_codec("zstd").decoder().decode(bomb, raw_len)


def test_a_compressed_block_larger_than_its_bound_is_refused_unread() -> None:
    bomb = rle_frame(10 << 30, 4096)
    data = preamble(1) + theader(shape=[1024], codec="zstd") + BLOCK.pack(4096, len(bomb), 0)
    with pytest.raises(LimitExceededError, match="block wire bytes"):
        decode_payload_bytes(data)


def test_a_second_zstd_frame_hidden_in_a_block_is_refused() -> None:
    cctx = zstandard.ZstdCompressor()
    wire = cctx.compress(b"\0" * 16) + cctx.compress(b"\1" * 16)
    data = preamble(1) + theader(shape=[4], codec="zstd") + block(wire, raw_len=16) + end(1)
    with pytest.raises(FrameError, match="corrupt"):
        decode_payload_bytes(data)


# --- structure --------------------------------------------------------------------------------

@pytest.mark.parametrize(("data", "error", "match"), [
    (MAGIC + frame({"t": "P", "v": 99, "kind": "r", "count": 0, "meta": {}}), ProtocolVersionError, "99"),
    (preamble(0, extra=1) + end(0), FrameError, "preamble keys"),
    (MAGIC + frame({"t": "T"}), FrameError, "not a preamble"),
    (MAGIC + frame([1, 2]), FrameError, "not a preamble"),
    (preamble(1) + theader() + block(b"\0" * 16) + theader() , FrameError, "more tensor frames"),
    (preamble(2) + theader() + block(b"\0" * 16) + theader() + block(b"\0" * 16), FrameError, "twice"),
    (preamble(1) + end(1), FrameError, "end frame after 0"),
    (preamble(0) + end(3), FrameError, "end frame"),
    (preamble(0) + frame({"t": "X"}), FrameError, "frame type"),
    (preamble(1) + theader(shape=[-1]), FrameError, "shape"),
    (preamble(1) + theader(shape=[True]), FrameError, "shape"),
    (preamble(1) + theader(shape="4"), FrameError, "shape"),
    (preamble(1) + theader(extra="x"), FrameError, "tensor header keys"),
    (preamble(1) + theader(shuffle=1), FrameError, "shuffle"),
    (preamble(1) + theader(name=b"w"), FrameError, "name"),
    (preamble(1) + theader(dtype="int32", wire="bfloat16"), FrameError, "cannot carry"),
    (preamble(1) + theader(wire="float32"), UnsupportedDtypeError, "allow-list"),
    (preamble(1) + theader() + block(b"\0" * 15), FrameError, "multiple of the item size"),
    (preamble(1) + theader() + BLOCK.pack(16, 0, 0), FrameError, "empty block"),
    (preamble(1) + theader() + BLOCK.pack(16, 17, 0), LimitExceededError, "block wire bytes"),
    (preamble(1) + theader() + BLOCK.pack(16, 16, 1) + b"\0" * 16, ChecksumError, "checksum"),
    (preamble(1) + theader(dtype="bool") + block(b"\0\1\2\0") + end(1), FrameError, "bool"),
    (preamble(-1), FrameError, "count"),
    (preamble(0, kind=""), FrameError, "kind"),
    (preamble(0, meta=[1]), FrameError, "meta"),  # type: ignore[arg-type]
    (MAGIC + struct.pack("<II", 0, 0), FrameError, "empty frame header"),
    (preamble(1) + group([]), FrameError, "non-empty list"),
    (preamble(1) + group("w"), FrameError, "non-empty list"),
    (preamble(1) + group([["w", "float32"]]), FrameError, r"\[name, dtype, shape\]"),
    (preamble(1) + group([["a", "float32", [1]], ["b", "float32", [1]]]), FrameError, "more tensors"),
    (preamble(2) + group([["a", "float32", [1]], ["a", "float32", [1]]]), FrameError, "twice"),
    (preamble(1) + group([["a", "float32", [1]]], extra=1), FrameError, "group header keys"),
    (preamble(2) + group([["a", "float32", [2048]], ["b", "float32", [2048]]])
     + block(b"\0" * 16384), FrameError, "truncated"),
    (preamble(2) + group([["a", "float32", [2048]], ["b", "float32", [2048]]])
     + block(b"\0" * 4096), FrameError, "one block"),
    (preamble(2) + group([["a", "bool", [2]], ["b", "int8", [2]]]) + block(b"\0\2\0\0") + end(2),
     FrameError, "bool"),
    (MAGIC + struct.pack("<II", 3, 0) + b"abc", ChecksumError, "header checksum"),
    (b"VCAX" + VALID[0][4:], FrameError, "magic"),
])
def test_structural_problems_name_the_field(data: bytes, error: type[WireError], match: str) -> None:
    with pytest.raises(error, match=match) as info:
        decode_payload_bytes(data)
    assert info.value.field


def test_an_unexpected_kind_is_refused() -> None:
    with pytest.raises(FrameError, match="expected a 'model' payload"):
        decode_payload_bytes(VALID[0], expected_kind="model")


def test_ext_types_and_timestamps_in_meta_are_refused() -> None:
    for value in (msgpack.ExtType(1, b"\0\0\0\0"), msgpack.Timestamp(1, 0)):
        data = MAGIC + frame_prefix(msgpack.packb(
            {"t": "P", "v": 1, "kind": "r", "count": 0, "meta": {"x": value}}, datetime=False)) + end(0)
        with pytest.raises(FrameError, match="ext"):
            decode_payload_bytes(data)
