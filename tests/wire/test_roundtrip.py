"""Round trips: every dtype, shape and layout through every codec, bit-exact (lossless) or within
the documented bound (lossy); streamed from chunks of any size; into reused ``out`` buffers."""

from __future__ import annotations

import math
import random
from collections.abc import AsyncIterator, Iterable

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vcasync.errors import SpecMismatchError
from vcasync.tensors import ModelSpec
from vcasync.wire import (
    ALL_DTYPE_NAMES,
    CodecSpec,
    LinkProfile,
    PayloadDecoder,
    aencode_payload,
    decode_payload,
    decode_payload_bytes,
    encode_payload,
    lossy_bound,
)
from vcasync.wire.dtypes import as_bytes

SETTINGS = settings(deadline=None, max_examples=150,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
CHUNK = 4096
LOSSLESS = ["raw", "zstd", "zstd-plain", "auto",
            CodecSpec("auto", link=LinkProfile(1.0)),            # a crawling link: zstd pays
            CodecSpec("auto", link=LinkProfile(1e15)),           # a very fast link: raw
            CodecSpec("zstd", level=3, shuffle=True)]


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-exact: dtype, shape and every byte (NaN payloads included)."""
    return (a.dtype == b.dtype and a.shape == b.shape
            and as_bytes(a.contiguous()).tobytes() == as_bytes(b.contiguous()).tobytes())


@st.composite
def tensors(draw: st.DrawFn) -> torch.Tensor:
    dtype: torch.dtype = getattr(torch, draw(st.sampled_from(sorted(ALL_DTYPE_NAMES))))
    if draw(st.integers(0, 5)) == 0:
        shape = [draw(st.integers(1000, 3000))]             # spans several 4 KiB blocks
    else:
        shape = draw(st.lists(st.integers(0, 5), min_size=0, max_size=4))
    layout = draw(st.sampled_from(["contiguous", "transposed", "strided"]))
    base_shape = list(shape)
    if layout == "strided" and base_shape:
        base_shape[-1] *= 2
    n = math.prod(base_shape)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    fill = draw(st.sampled_from(["random", "small", "zeros"]))
    size = n * dtype.itemsize
    if fill == "random":
        raw = rng.integers(0, 256, size, dtype=np.uint8)
    elif fill == "small":
        raw = np.zeros(size, dtype=np.uint8)
        raw[:: dtype.itemsize] = rng.integers(0, 4, n, dtype=np.uint8)
    else:
        raw = np.zeros(size, dtype=np.uint8)
    if dtype == torch.bool:
        raw &= 1
    t = torch.from_numpy(raw).view(dtype).reshape(base_shape) if n else torch.empty(base_shape, dtype=dtype)
    if layout == "strided" and base_shape:
        t = t[..., ::2]
    elif layout == "transposed" and t.dim() >= 2:
        t = t.transpose(0, -1)
    return t


state_dicts = st.dictionaries(st.text(min_size=1, max_size=12), tensors(), max_size=6)
metas = st.dictionaries(st.text(max_size=8), st.none() | st.booleans() | st.integers(-2**63, 2**63 - 1)
                        | st.floats(allow_nan=False) | st.text(max_size=20) | st.binary(max_size=20)
                        | st.lists(st.integers(-2**63, 2**64 - 1), max_size=4), max_size=5)


def rechunk(chunks: Iterable[bytes | memoryview], sizes: list[int]) -> list[bytes]:
    """The same stream split at other places (sizes cycle)."""
    data = b"".join(chunks)
    out, pos, i = [], 0, 0
    while pos < len(data):
        step = sizes[i % len(sizes)]
        out.append(data[pos:pos + step])
        pos += step
        i += 1
    return out


@SETTINGS
@given(sd=state_dicts, meta=metas, codec=st.sampled_from(LOSSLESS),
       splits=st.lists(st.integers(1, 5000), min_size=1, max_size=5))
def test_lossless_round_trip_is_bit_exact(sd: dict[str, torch.Tensor], meta: dict[str, object],
                                          codec: str | CodecSpec, splits: list[int]) -> None:
    chunks = list(encode_payload("result", meta, sd, codec=codec, chunk_size=CHUNK))
    dec = PayloadDecoder(spec=ModelSpec.of(sd), expected_kind="result")
    for piece in rechunk(chunks, splits):
        dec.feed(piece)
    p = dec.finish()
    assert p.kind == "result"
    assert p.meta == meta
    assert list(p.tensors) == list(sd)
    for name, t in sd.items():
        got = p.tensors[name]
        assert same(got, t), name
        assert got.is_contiguous()
        if got.numel():
            got.view(-1)[0:1].copy_(got.view(-1)[0:1])  # writable, owned
    whole = decode_payload_bytes(b"".join(chunks))
    assert all(same(whole.tensors[k], v) for k, v in sd.items())


@SETTINGS
@given(data=st.data(), target=st.sampled_from(["bfloat16", "float16"]),
       dtype=st.sampled_from([torch.float32, torch.float64]), compressed=st.booleans())
def test_lossy_round_trip_is_within_the_documented_bound(data: st.DataObject, target: str,
                                                         dtype: torch.dtype, compressed: bool) -> None:
    bounded = st.floats(-65504.0, 65504.0, width=32) if target == "float16" else \
        st.floats(allow_nan=False, allow_infinity=False, width=32)
    values = data.draw(st.lists(bounded
                                | st.sampled_from([math.nan, math.inf, -math.inf, 0.0, -0.0, 1e-30]),
                                min_size=0, max_size=3000))
    x = torch.tensor(values, dtype=dtype)
    others = {"steps": torch.arange(5), "half": torch.randn(4).to(torch.float16)}
    spec = CodecSpec("zstd" if compressed else "raw", lossy=target)
    payload = decode_payload_bytes(b"".join(encode_payload("result", {}, {"x": x, **others},
                                                           codec=spec, chunk_size=CHUNK)))
    y = payload.tensors["x"]
    assert y.dtype == dtype
    assert y.shape == x.shape
    for k, v in others.items():                          # ints and halves are never downcast
        assert same(payload.tensors[k], v)
    rel, absolute = lossy_bound(getattr(torch, target))
    finite = torch.isfinite(x)
    assert torch.equal(torch.isnan(y), torch.isnan(x))
    assert torch.equal(y[torch.isinf(x)], x[torch.isinf(x)])
    err = (y[finite].double() - x[finite].double()).abs()
    assert bool((err <= x[finite].double().abs() * rel + absolute).all())


def test_lossy_float16_falls_back_to_full_precision_when_values_overflow() -> None:
    x = torch.tensor([1.0, 1e6, -3.0])
    p = decode_payload_bytes(b"".join(encode_payload("r", {}, {"x": x}, codec="fp16")))
    assert same(p.tensors["x"], x)


def test_lossy_decodes_to_the_spec_dtype_into_out_buffers() -> None:
    x = torch.randn(10_000)
    out = {"x": torch.empty(10_000)}
    chunks = encode_payload("r", {}, {"x": x}, codec="bf16", chunk_size=CHUNK)
    p = decode_payload_bytes(b"".join(chunks), spec=ModelSpec.of({"x": x}), out=out)
    assert p.tensors["x"] is out["x"]
    assert torch.allclose(out["x"], x, rtol=2**-8, atol=0)


@pytest.mark.parametrize("codec", ["raw", "zstd", "bf16"])
def test_out_buffers_are_filled_in_place(codec: str) -> None:
    sd = {"w": torch.randn(64, 33), "n": torch.tensor(7), "e": torch.empty(0)}
    out = {k: torch.full_like(v, 3) for k, v in sd.items()}
    p = decode_payload_bytes(b"".join(encode_payload("m", {}, sd, codec=codec, chunk_size=CHUNK)),
                             out=out)
    for k in sd:
        assert p.tensors[k] is out[k]
    assert same(out["n"], sd["n"])


def test_out_buffer_of_the_wrong_shape_is_refused() -> None:
    data = b"".join(encode_payload("m", {}, {"w": torch.zeros(3)}))
    with pytest.raises(SpecMismatchError, match="out buffer"):
        decode_payload_bytes(data, out={"w": torch.zeros(4)})
    with pytest.raises(SpecMismatchError, match="contiguous"):
        decode_payload_bytes(data, out={"w": torch.zeros(3, 2)[:, 0]})


def test_zero_copy_yields_views_of_the_tensors() -> None:
    t = torch.randn(100_000)
    chunks = list(encode_payload("m", {}, {"t": t}, zero_copy=True, chunk_size=1 << 16))
    views = [c for c in chunks if isinstance(c, memoryview)]
    assert views, "raw blocks should be views"
    base = t.numpy()
    assert all(np.shares_memory(np.frombuffer(v, dtype=np.uint8), base) for v in views)
    assert same(decode_payload_bytes(b"".join(chunks)).tensors["t"], t)
    assert all(isinstance(c, bytes) for c in encode_payload("m", {}, {"t": t}))


def test_many_small_tensors_are_coalesced_into_few_chunks() -> None:
    sd = {f"b{i}": torch.full((3,), float(i)) for i in range(2000)}
    chunks = list(encode_payload("m", {}, sd, chunk_size=1 << 16))
    assert len(chunks) < 10
    assert max(len(c) for c in chunks) < 2 * (1 << 16)
    p = decode_payload_bytes(b"".join(chunks))
    assert all(same(p.tensors[k], v) for k, v in sd.items())


def test_auto_compresses_on_slow_links_only_when_it_pays() -> None:
    compressible = {"z": torch.zeros(50_000), "c": torch.arange(50_000, dtype=torch.int64) % 7}
    random_bytes = {"r": torch.from_numpy(np.random.default_rng(1).integers(0, 256, 200_000,
                                                                            dtype=np.uint8))}
    slow = CodecSpec("auto", link=LinkProfile.mbit(1))
    fast = CodecSpec("auto", link=LinkProfile(1e15))
    raw_size = len(b"".join(encode_payload("m", {}, compressible)))
    assert len(b"".join(encode_payload("m", {}, compressible, codec=slow))) < raw_size / 10
    assert len(b"".join(encode_payload("m", {}, compressible, codec=fast))) == raw_size
    rnd = len(b"".join(encode_payload("m", {}, random_bytes)))
    assert len(b"".join(encode_payload("m", {}, random_bytes, codec=slow))) == rnd
    via_link = b"".join(encode_payload("m", {}, compressible, codec="auto", link=LinkProfile.mbit(1)))
    assert len(via_link) < raw_size / 10


def test_gpu_less_cpu_tensor_requires_no_grad_detach() -> None:
    w = torch.nn.Linear(4, 3)
    sd = dict(w.named_parameters())                 # requires_grad=True tensors are sent as data
    p = decode_payload_bytes(b"".join(encode_payload("m", {}, sd)))
    assert all(same(p.tensors[k], v.detach()) for k, v in sd.items())
    assert not any(t.requires_grad for t in p.tensors.values())


async def _aiter(chunks: Iterable[bytes]) -> AsyncIterator[bytes]:
    for c in chunks:
        yield c


@pytest.mark.parametrize("codec", ["raw", "zstd", "bf16", "auto"])
async def test_async_encode_and_streaming_decode_from_tiny_chunks(codec: str) -> None:
    sd = {"conv.weight": torch.randn(16, 8, 3, 3), "bn.num_batches_tracked": torch.tensor(12),
          "bn.running_var": torch.rand(16), "mask": torch.rand(40) > 0.5,
          "fc.weight": torch.randn(300, 100).t()}
    chunks = [c async for c in aencode_payload("result", {"steps": 3}, sd, codec=codec,
                                               chunk_size=CHUNK)]
    rng = random.Random(7)
    data = b"".join(chunks)
    tiny, pos = [], 0
    while pos < len(data):
        step = rng.randint(1, 64)
        tiny.append(data[pos:pos + step])
        pos += step
    p = await decode_payload(_aiter(tiny), spec=ModelSpec.of(sd), expected_kind="result")
    assert p.meta == {"steps": 3}
    for k, v in sd.items():
        if codec == "bf16" and v.is_floating_point():
            assert torch.allclose(p.tensors[k], v, rtol=2**-8, atol=0)
        else:
            assert same(p.tensors[k], v)
    big = await decode_payload(_aiter(rechunk(chunks, [3 << 20])), spec=ModelSpec.of(sd))
    assert list(big.tensors) == list(sd)


async def test_async_encode_can_be_abandoned_midway() -> None:
    sd = {f"t{i}": torch.randn(100_000) for i in range(30)}
    gen = aencode_payload("m", {}, sd, chunk_size=1 << 16)
    first = await gen.__anext__()
    assert first.startswith(b"VCAW")
    await gen.aclose()
