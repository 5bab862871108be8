"""Codec configuration: presets, specs, the block-codec registry, shuffle, limits validation."""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vcasync.errors import ConfigError, FrameError, UnsupportedDtypeError
from vcasync.wire import (
    CodecSpec,
    Limits,
    LinkProfile,
    block_codec_names,
    checksum,
    codec_names,
    decode_payload_bytes,
    encode_payload,
    register_block_codec,
    register_codec,
    resolve_codec,
)
from vcasync.wire.codecs import block_codec, shuffle_into, unshuffle_into
from vcasync.wire.plan import describe


def test_presets() -> None:
    assert {"raw", "zstd", "zstd-plain", "auto", "bf16", "fp16"} <= set(codec_names())
    assert resolve_codec("zstd") == CodecSpec("zstd", level=1, shuffle=True)
    assert resolve_codec("bf16").lossy == "bfloat16"
    link = LinkProfile.mbit(100)
    assert resolve_codec("auto", link=link).link == link
    assert describe(resolve_codec("bf16")) == "zstd+l1+shuffle+bfloat16"
    with pytest.raises(ConfigError, match="unknown codec 'lz77'; known: \\["):
        resolve_codec("lz77")


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"compression": "brotli"}, "codec 'brotli'"), ({"lossy": "int8"}, "lossy"),
    ({"level": 99}, "level"), ({"threads": -1}, "threads"),
])
def test_bad_specs_are_refused(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises((ConfigError, UnsupportedDtypeError), match=match):
        CodecSpec(**kwargs)


def test_link_profiles() -> None:
    assert LinkProfile.mbit(8).bandwidth == 1e6
    assert LinkProfile.from_transfer(1000, 2.0).bandwidth == 500
    with pytest.raises(ConfigError):
        LinkProfile(0)


def test_register_codec() -> None:
    register_codec("zstd-9-test", CodecSpec("zstd", level=9))
    try:
        with pytest.raises(ConfigError, match="already registered"):
            register_codec("zstd-9-test", CodecSpec("zstd", level=9))
        with pytest.raises(ConfigError, match="CodecSpec"):
            register_codec("bad", "zstd")  # type: ignore[arg-type]
        t = {"w": torch.zeros(1000)}
        data = b"".join(encode_payload("m", {}, t, codec="zstd-9-test"))
        assert torch.equal(decode_payload_bytes(data).tensors["w"], t["w"])
    finally:
        register_codec("zstd-9-test", CodecSpec("zstd"), replace=True)


@dataclass(frozen=True)
class _ZlibCodec:
    """A third-party block codec, registered like a plugin."""

    name: str = "zlib-test"

    def encoder(self, level: int, threads: int) -> Any:
        class Enc:
            def encode(self, block: np.ndarray[Any, Any]) -> bytes:
                return zlib.compress(block.tobytes(), 1)
        return Enc()

    def decoder(self) -> Any:
        class Dec:
            def decode(self, wire: Any, raw_len: int) -> bytes:
                d = zlib.decompressobj()
                out = d.decompress(bytes(wire), raw_len)
                if len(out) != raw_len or d.unconsumed_tail or not d.eof:
                    raise FrameError("zlib block does not decode to its size", field="block.zlib")
                return out
        return Dec()

    def max_wire_len(self, raw_len: int) -> int:
        return raw_len + raw_len // 1000 + 64


def test_a_registered_block_codec_round_trips_but_must_be_allowed() -> None:
    register_block_codec(_ZlibCodec(), replace=True)
    assert "zlib-test" in block_codec_names()
    sd = {"w": torch.arange(5000, dtype=torch.float32)}
    data = b"".join(encode_payload("m", {}, sd, codec=CodecSpec("zlib-test")))
    with pytest.raises(UnsupportedDtypeError, match="not allowed"):
        decode_payload_bytes(data)
    limits = Limits(allowed_codecs=frozenset({"raw", "zstd", "zlib-test"}))
    assert torch.equal(decode_payload_bytes(data, limits=limits).tensors["w"], sd["w"])


def test_register_block_codec_validates() -> None:
    with pytest.raises(ConfigError, match="not a BlockCodec"):
        register_block_codec(object())  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="already registered"):
        register_block_codec(block_codec("zstd"))


@pytest.mark.parametrize("itemsize", [1, 2, 4, 8, 16])
def test_shuffle_is_inverted_by_unshuffle(itemsize: int) -> None:
    src = np.random.default_rng(0).integers(0, 256, itemsize * 37, dtype=np.uint8)
    shuffled = shuffle_into(src, itemsize, np.empty(4096, dtype=np.uint8)).copy()
    if itemsize > 1:
        assert shuffled[:37].tolist() == src[::itemsize].tolist()     # first byte plane
    back = np.empty_like(src)
    unshuffle_into(shuffled, itemsize, back)
    assert back.tolist() == src.tolist()


def test_limits_validate_their_fields() -> None:
    with pytest.raises(ConfigError, match="max_dims"):
        Limits(max_dims=-1)
    with pytest.raises(ConfigError, match="unknown dtypes"):
        Limits(allowed_dtypes=frozenset({"float128"}))
    assert isinstance(Limits(allowed_dtypes={"float32"}).allowed_dtypes, frozenset)  # type: ignore[arg-type]


def test_checksum_is_crc32_on_every_buffer_kind() -> None:
    data = b"123456789"
    assert checksum(data) == 0xCBF43926 == zlib.crc32(data)   # the CRC-32 check value
    for buf in (bytearray(data), memoryview(data), np.frombuffer(data, dtype=np.uint8)):
        assert checksum(buf) == 0xCBF43926
    assert checksum(b"") == 0


@given(st.binary(max_size=3000), st.integers(0, 64))
@settings(deadline=None, max_examples=100)
def test_checksum_agrees_with_zlib_fallback(data: bytes, skip: int) -> None:
    view = memoryview(data)[skip:]
    assert checksum(view) == zlib.crc32(view)


def test_encode_side_errors() -> None:
    with pytest.raises(UnsupportedDtypeError):
        list(encode_payload("m", {}, {"q": torch.empty(2, dtype=torch.bits8)}))
    with pytest.raises(TypeError, match=r"not a torch\.Tensor"):
        list(encode_payload("m", {}, {"x": [1, 2]}))  # type: ignore[dict-item]
    with pytest.raises(ConfigError, match="chunk_size"):
        list(encode_payload("m", {}, {}, chunk_size=10))
    with pytest.raises(ConfigError, match="kind"):
        list(encode_payload("", {}, {}))
    with pytest.raises(TypeError, match="msgpack"):
        list(encode_payload("m", {"o": object()}, {}))


def test_both_codec_tables_are_the_one_registry_mechanism() -> None:
    """Block codecs and codec presets live in ``_registry.Registry``, like policies and backends:
    the same register/replace/duplicate rules and an unknown name answered by the registry."""
    from vcasync._registry import Registry
    from vcasync.wire import codecs as block_codecs
    from vcasync.wire import plan

    assert isinstance(block_codecs._BLOCK_CODECS, Registry)
    assert isinstance(plan._PRESETS, Registry)
    assert codec_names() == plan._PRESETS.names()
    assert block_codec_names() == block_codecs._BLOCK_CODECS.names()


@pytest.mark.parametrize("name", [None, 3, ["zstd"], "x" * 100])
def test_a_hostile_codec_name_is_a_wire_error_never_a_crash(name: Any) -> None:
    allowed = Limits().allowed_codecs
    for limit in (None, allowed):
        with pytest.raises(UnsupportedDtypeError, match="is not allowed") as info:
            block_codec(name, limit)
        assert info.value.field == "codec"
    with pytest.raises(ConfigError, match="unknown codec"):
        resolve_codec(name)
