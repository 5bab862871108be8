"""The wire format, pinned: the exact bytes of a fixed payload, as the encoder produced them before
its per-tensor costs were cut. A faster encoder must send the same bytes (peers of every version
decode them), so any change here is a protocol change and needs a new PROTOCOL_VERSION."""

from __future__ import annotations

import hashlib

import pytest
import torch

from vcasync.wire import decode_payload_bytes, encode_payload


def _values(n: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Exact, platform-independent values: integer arithmetic, then a power-of-two scale."""
    i = torch.arange(n, dtype=torch.int64)
    return ((i * 2654435761) % (1 << 20) - (1 << 19)).to(torch.float64).div_(1 << 12).to(dtype)


def fixed_state() -> dict[str, torch.Tensor]:
    """Big and small tensors (groups and tensor frames), several dtypes, an empty tensor, a
    0-d counter, a bool mask and a non-contiguous view: every path of the encoder."""
    return {
        "conv.weight": _values(64 * 32 * 9).reshape(64, 32, 3, 3),
        "bn.weight": _values(64) + 1,
        "bn.bias": _values(64) / 8,
        "bn.num_batches_tracked": torch.tensor(12345, dtype=torch.int64),
        "fc.weight": _values(300 * 1000).reshape(300, 1000),
        "fc.bias": _values(1000, torch.float16),
        "emb": (torch.arange(70000) % 251).to(torch.uint8),
        "mask": torch.tensor([True, False, True]),
        "empty": torch.empty(0, 5),
        "strided": _values(40 * 50).reshape(40, 50).t(),
        "half.big": _values(50000, torch.bfloat16),
    }


PINNED = {
    ("raw", 1048576): (1454873, "058a47dac7811e1ed89a9960f2f064f0cf1d22c1d3527a809934777c1f3128f0"),
    ("raw", 65536): (1455172, "9a9668db86e9fca7177a9ee23f3d989547ee10603672156e045b2fbe25f9e80f"),
    ("raw", 4096): (1459191, "8d7c72c6ec37d33e6118c7c33c2fcd9fb26a33ca80c8d002f5a404cbddc2952e"),
    ("bf16-raw", 1048576): (818025, "08ef85bdfdb5954ba922af304112ecbe850a6aa1fb7920730aef32ae5b567d9e"),
    ("bf16-raw", 65536): (814230, "c109e850166f77a2e7f91d3dbe3490793e8e25249354e79ade8e5783d923b711"),
    ("fp16-raw", 65536): (814227, "8bb4de3ed451110e330cd8ba8b07a7397b9c61efd8cf71201e9a951c7c37dc53"),
}


def _encode(codec: str, chunk_size: int, zero_copy: bool) -> bytes:
    chunks = encode_payload("model", {"version": 3, "note": "pin"}, fixed_state(), codec=codec,
                            chunk_size=chunk_size, zero_copy=zero_copy)
    return b"".join(bytes(c) for c in chunks)


@pytest.mark.parametrize("zero_copy", [False, True])
@pytest.mark.parametrize(("codec", "chunk_size"), sorted(PINNED))
def test_encoder_output_is_byte_identical_to_the_pinned_format(codec: str, chunk_size: int,
                                                               zero_copy: bool) -> None:
    data = _encode(codec, chunk_size, zero_copy)
    assert (len(data), hashlib.sha256(data).hexdigest()) == PINNED[codec, chunk_size]


def test_the_pinned_payload_decodes_to_its_tensors() -> None:
    sd = fixed_state()
    got = decode_payload_bytes(_encode("raw", 1 << 16, True)).tensors
    assert list(got) == list(sd)
    for name, t in sd.items():
        assert torch.equal(got[name], t), name
