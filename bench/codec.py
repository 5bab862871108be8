"""Benchmark the tensor wire (``python -m bench.codec [--quick] [--json]``).

Encodes and decodes a ResNet-50 state dict (25.6M params; the same layout at 2x channels, ~102M) through every
codec, weights and deltas, and measures in the same run, on the same bytes: a plain memcpy into an
existing buffer, the zstandard library alone (with and without the numpy byte-plane shuffle),
``torch.save``/``torch.load(weights_only=True)`` through BytesIO, safetensors bytes, pickle 5 with
out-of-band buffers, and Flower's ndarray serialisation when ``flwr`` is importable (hivemind too).

Mode, for every figure: *warm*. Every destination is allocated once and reused (our decoder fills
``out`` buffers; memcpy copies into a preallocated array); peers allocate as they always do, and
run repeatedly so freed memory is reused. ``raw fresh`` additionally shows our decoder allocating
new tensors each time. Each figure is the median of ``--reps`` runs after one warm-up. Each timed
ratio and throughput ``X_<size>`` has ``X_spread_<size>``: the [min, median, max] of the same ratio
per round (each round's median call of each side; a round where our side failed is 0), and the
printed time column shows each contender's median with the min-max of its rounds' medians.
Compression ratios are byte counts, the same every repetition: no spread.

Failures: every round trip of ours is checked outside the clock (every tensor back, bit-exact, or
within the documented bound of a lossy codec); a call that raises or comes back wrong, warm-ups
included, is counted in ``failed`` (``failures_<size>`` names the contender and the first error)
and enters its median as an infinite time, so its ratios sink to 0 (or null), never leave it out.

Data: no pretrained weights can be downloaded here, so the weights are synthetic but shaped like
trained ones: Laplace-distributed (heavy-tailed, as trained conv weights are) with a He-style scale
per layer, BatchNorm gamma ~ N(1, 0.1), beta ~ N(0, 0.05), running means/vars, int64 counters. The
delta is a real fp32 subtraction of two nearby models (``(w - lr*g) - w`` with Gaussian ``g``), as a
worker's result after a few local steps would be. Uniform or Gaussian weights compress the same
(within 0.01 of the ratio); what matters is the fp32 layout: sign and exponent bytes compress,
mantissa bytes do not.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import pickle
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import zstandard

from vcasync.wire import CodecSpec, LinkProfile, PayloadDecoder, encode_payload
from vcasync.wire.codecs import shuffle_into, unshuffle_into
from vcasync.wire.dtypes import LOSSY_TARGETS
from vcasync.wire.frames import checksum
from vcasync.wire.plan import lossy_bound, resolve_codec

from ._stats import add_quick, finite, one_of, parse_args, positive_int, spread

State = dict[str, torch.Tensor]


# --- data -----------------------------------------------------------------------------------

def resnet50_shapes(scale: float = 1.0) -> list[tuple[str, tuple[int, ...], torch.dtype]]:
    """Names, shapes and dtypes of a torchvision ResNet-50 state dict with every channel count
    multiplied by ``scale`` (1: the real 25.6M params; 2: ~102M; 0.5: ~6.4M)."""
    out: list[tuple[str, tuple[int, ...], torch.dtype]] = []

    def ch(c: int) -> int:
        return max(1, round(c * scale))

    def bn(prefix: str, c: int) -> None:
        for p in ("weight", "bias", "running_mean", "running_var"):
            out.append((f"{prefix}.{p}", (c,), torch.float32))
        out.append((f"{prefix}.num_batches_tracked", (), torch.int64))

    out.append(("conv1.weight", (ch(64), 3, 7, 7), torch.float32))
    bn("bn1", ch(64))
    inplanes = ch(64)
    for li, (blocks, planes) in enumerate(zip((3, 4, 6, 3), (64, 128, 256, 512), strict=True), 1):
        mid, outc = ch(planes), ch(planes * 4)
        for b in range(blocks):
            p = f"layer{li}.{b}"
            out.append((f"{p}.conv1.weight", (mid, inplanes, 1, 1), torch.float32))
            bn(f"{p}.bn1", mid)
            out.append((f"{p}.conv2.weight", (mid, mid, 3, 3), torch.float32))
            bn(f"{p}.bn2", mid)
            out.append((f"{p}.conv3.weight", (outc, mid, 1, 1), torch.float32))
            bn(f"{p}.bn3", outc)
            if b == 0:
                out.append((f"{p}.downsample.0.weight", (outc, inplanes, 1, 1), torch.float32))
                bn(f"{p}.downsample.1", outc)
            inplanes = outc
    out.append(("fc.weight", (1000, inplanes), torch.float32))
    out.append(("fc.bias", (1000,), torch.float32))
    return out


def trained_like(shapes: list[tuple[str, tuple[int, ...], torch.dtype]], seed: int = 0) -> State:
    g = torch.Generator().manual_seed(seed)
    sd: State = {}
    for name, shape, dtype in shapes:
        if dtype == torch.int64:
            sd[name] = torch.tensor(12345, dtype=torch.int64)
            continue
        n = math.prod(shape)
        if name.endswith("running_var"):
            t = torch.rand(n, generator=g) * 2 + 0.05
        elif name.endswith("weight") and len(shape) == 1:       # BN gamma
            t = 1 + 0.1 * torch.randn(n, generator=g)
        elif len(shape) == 1:                                     # biases, running means
            t = 0.05 * torch.randn(n, generator=g)
        else:
            fan_in = math.prod(shape[1:])
            u = torch.rand(n, generator=g).clamp_(1e-7, 1 - 1e-7)
            laplace = -torch.sign(u - 0.5) * torch.log1p(-2 * (u - 0.5).abs())
            t = laplace * (math.sqrt(2.0 / fan_in) / math.sqrt(2.0))
        sd[name] = t.reshape(shape).to(dtype)
    return sd


def nearby_delta(sd: State, seed: int = 1, lr: float = 1e-3) -> State:
    """``w' - w`` in fp32 for ``w' = w - lr * g``: a worker's delta after a few local steps."""
    g = torch.Generator().manual_seed(seed)
    out: State = {}
    for k, w in sd.items():
        if not w.is_floating_point():
            out[k] = torch.zeros_like(w)
            continue
        step = lr * w.abs().mean().clamp_min(1e-3) * torch.randn(w.shape, generator=g)
        out[k] = (w - step) - w
    return out


# --- timing ---------------------------------------------------------------------------------

#: ``thread_time`` (CPU seconds of this thread: every contender runs in it, torch with one thread)
#: unless ``--clock wall``: on a machine shared with other jobs, wall time also counts the time
#: this process waited for a core.
CLOCK: dict[str, Callable[[], float]] = {"cpu": time.thread_time, "wall": time.perf_counter}
clock = CLOCK["cpu"]

class Failures:
    """Calls that raised or whose output was wrong, per contender: counted, never dropped (a
    failed call's time is infinite in the figures, so its ratio to memcpy is 0)."""

    def __init__(self) -> None:
        self.count: dict[str, int] = {}
        self.first: dict[str, str] = {}

    def add(self, name: str, why: str) -> float:
        self.count[name] = self.count.get(name, 0) + 1
        self.first.setdefault(name, why)
        return math.inf

    def total(self) -> int:
        return sum(self.count.values())


def timed_call(name: str, fn: Callable[[], Any], check: Callable[[], str | None] | None,
               failures: Failures) -> float:
    """Seconds of one call of ``fn`` (infinite when it raised or ``check`` then found its output
    wrong: ``check`` runs outside the clock and says what is wrong, or None)."""
    t0 = clock()
    try:
        fn()
    except Exception as exc:   # counted in the figures, the race goes on
        return failures.add(name, f"{type(exc).__name__}: {exc}")
    elapsed = clock() - t0
    wrong = check() if check is not None else None
    return elapsed if wrong is None else failures.add(name, wrong)


def race(contenders: dict[str, Callable[[], Any]], reps: int, min_round_s: float = 0.25,
         rounds: dict[str, list[float]] | None = None,
         checks: dict[str, Callable[[], str | None]] | None = None,
         failures: Failures | None = None) -> dict[str, float]:
    """Median seconds per call per contender, run round-robin after one warm-up each, so a load
    spike on this shared machine hits every contender alike instead of skewing one ratio. A
    fast contender is called several times in a row per round (enough for ``min_round_s``,
    at most 20), so its median rests on as much wall time as a slow one's: 7 rounds of a 10 ms
    memcpy alone were 70 ms of a noisy machine, and the ratios wandered by 0.1 between runs.
    A call that raises, or whose output ``checks[name]`` finds wrong, is counted in ``failures``
    (warm-ups too) and enters its median as an infinite time."""
    checks = checks or {}
    failures = failures if failures is not None else Failures()
    inner: dict[str, int] = {}
    for name, fn in contenders.items():
        # warm-up: allocations, caches, lazy imports
        warm = timed_call(name, fn, checks.get(name), failures)
        inner[name] = max(1, min(20, round(min_round_s / max(warm, 1e-6)))) if math.isfinite(warm) else 1
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(reps):
        for name, fn in contenders.items():
            mine = [timed_call(name, fn, checks.get(name), failures) for _ in range(inner[name])]
            times[name] += mine
            if rounds is not None:     # each round's median: the spread of a ratio across rounds
                rounds.setdefault(name, []).append(statistics.median(mine))
    return {name: statistics.median(ts) for name, ts in times.items()}


def nbytes(sd: State) -> int:
    return sum(t.numel() * t.element_size() for t in sd.values())


# --- references and peers -------------------------------------------------------------------

def memcpy_fn(sd: State) -> Callable[[], None]:
    src = [t.numpy() for t in sd.values()]
    dst = [np.empty_like(a) for a in src]

    def run() -> None:
        for s, d in zip(src, dst, strict=True):
            np.copyto(d, s)
    return run


def floor_fn(sd: State, digest: Callable[[Any], object], chunk: int = 1 << 20, *,
             sender: bool = True) -> Callable[[], None]:
    """The floor of any checksummed stream, with no vcasync code: per 1 MiB block (the wire's
    block), the sender's ``digest`` of the source, a copy into the destination, the receiver's
    ``digest`` of what it received. ``sender=False``: the receiver's alone (what a stream whose
    sender sent no checksum, so that nothing checks the bytes in transit, would cost)."""
    src = [t.reshape(-1).view(torch.uint8).numpy() if t.numel() else np.empty(0, np.uint8)
           for t in sd.values()]
    dst = [np.empty_like(a) for a in src]

    def run() -> None:
        for s_, d in zip(src, dst, strict=True):
            for off in range(0, max(s_.shape[0], 1), chunk):
                a, b = s_[off:off + chunk], d[off:off + chunk]
                if sender:
                    digest(a)
                np.copyto(b, a)
                digest(b)
    return run


def crc_floor_fn(sd: State) -> Callable[[], None]:
    """The floor with the checksum the wire uses (CRC-32)."""
    return floor_fn(sd, checksum)


def receiver_crc_floor_fn(sd: State) -> Callable[[], None]:
    """The same floor with the receiver's CRC-32 alone: the best any round trip with one checksum
    pass per block reaches, the bound on what dropping the sender's checksum from the wire buys."""
    return floor_fn(sd, checksum, sender=False)


def xxh3_floor_fn(sd: State) -> Callable[[], None] | None:
    """The same floor with xxHash's XXH3-128 in place of CRC-32 (``xxhash``, when importable): the
    cheapest adequate checksum measured here (~57 GB/s on a cached 1 MiB block against ISA-L
    CRC-32's ~33), so what a wire format change would buy at best."""
    try:
        import xxhash
    except ImportError:
        return None
    return floor_fn(sd, xxhash.xxh3_128_intdigest)


def zstd_library_fn(sd: State, shuffle: bool, wire: dict[str, int], key: str) -> Callable[[], None]:
    """Bare zstandard, one frame per tensor (numpy shuffle around it when ``shuffle``)."""
    cctx, dctx = zstandard.ZstdCompressor(level=1), zstandard.ZstdDecompressor()
    arrays = [t.reshape(-1).view(torch.uint8).numpy() if t.numel() else np.empty(0, np.uint8)
              for t in sd.values()]
    sizes = [t.element_size() for t in sd.values()]
    scratch = np.empty(max(a.shape[0] for a in arrays), dtype=np.uint8)
    outs = [np.empty_like(a) for a in arrays]

    def run() -> None:
        total = 0
        for a, isz, out in zip(arrays, sizes, outs, strict=True):
            src = shuffle_into(a, isz, scratch) if shuffle and isz > 1 else a
            comp = cctx.compress(src.data)
            total += len(comp)
            raw = np.frombuffer(dctx.decompress(comp), dtype=np.uint8)
            if shuffle and isz > 1:
                unshuffle_into(raw, isz, out)
            else:
                np.copyto(out, raw)
        wire[key] = total
    return run


def torch_save_fn(sd: State) -> Callable[[], None]:
    def run() -> None:
        buf = io.BytesIO()
        torch.save(sd, buf)
        buf.seek(0)
        torch.load(buf, weights_only=True)
    return run


def safetensors_fn(sd: State) -> Callable[[], None] | None:
    try:
        from safetensors.torch import load, save
    except ImportError:
        return None
    contiguous = {k: v.contiguous() for k, v in sd.items()}
    return lambda: load(save(contiguous))


def pickle5_fn(sd: State) -> Callable[[], None]:
    arrays = {k: v.numpy() for k, v in sd.items()}

    def run() -> None:
        buffers: list[pickle.PickleBuffer] = []
        data = pickle.dumps(arrays, protocol=5, buffer_callback=buffers.append)
        received = [bytearray(b.raw()) for b in buffers]     # the bytes as they arrive: one copy
        pickle.loads(data, buffers=received)
    return run


def flower_fn(sd: State) -> Callable[[], None] | None:
    try:
        from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays
    except ImportError:
        return None
    arrays = [v.numpy() for v in sd.values()]
    return lambda: parameters_to_ndarrays(ndarrays_to_parameters(arrays))


def hivemind_fn(sd: State) -> Callable[[], None] | None:
    try:
        from hivemind.compression import deserialize_torch_tensor, serialize_torch_tensor
    except ImportError:
        return None

    def run() -> None:
        for t in sd.values():
            deserialize_torch_tensor(serialize_torch_tensor(t))
    return run


# --- ours -----------------------------------------------------------------------------------

def mismatch(sent: State, got: dict[str, torch.Tensor], lossy: str | None) -> str | None:
    """What is wrong with ``got`` as the decoding of ``sent`` (None: nothing): every tensor back,
    same dtype and shape, bit-exact, or within the documented bound of a ``lossy`` codec."""
    if set(got) != set(sent):
        return f"tensors differ: {sorted(set(sent) ^ set(got))[:3]}"
    rel, absolute = lossy_bound(LOSSY_TARGETS[lossy]) if lossy else (0.0, 0.0)
    for k, x in sent.items():
        y = got[k]
        if y.dtype != x.dtype or y.shape != x.shape:
            return f"{k}: {y.dtype} {tuple(y.shape)} back for {x.dtype} {tuple(x.shape)}"
        if lossy and x.is_floating_point():
            if not bool(((y - x).abs() <= x.abs() * rel + absolute).all()):
                return f"{k}: off by more than the {lossy} bound"
        elif not torch.equal(y, x):
            return f"{k}: not bit-exact"
    return None


def ours_fns(sd: State, codec: str | CodecSpec, wire: dict[str, int], key: str, *,
             reuse: bool = True, zero_copy: bool = True
             ) -> tuple[Callable[[], None], Callable[[], None], Callable[[], str | None]]:
    """(round trip, encode only, check): streamed encode -> decode, chunk by chunk (the whole
    message is never built), into reused ``out`` buffers when ``reuse``; ``check`` says what is
    wrong with the last round trip's tensors (None: nothing)."""
    out = {k: torch.empty_like(v) for k, v in sd.items()} if reuse else None
    spec = resolve_codec(codec)
    last: dict[str, dict[str, torch.Tensor]] = {}

    def roundtrip() -> None:
        last.clear()
        dec = PayloadDecoder(out=out)
        total = 0
        for chunk in encode_payload("model", {"version": 1}, sd, codec=codec, zero_copy=zero_copy):
            total += len(chunk)
            dec.feed(chunk)
        last["tensors"] = dec.finish().tensors
        wire[key] = total

    def encode_only() -> None:
        for _ in encode_payload("model", {"version": 1}, sd, codec=codec, zero_copy=zero_copy):
            pass

    def check() -> str | None:
        return mismatch(sd, last["tensors"], spec.lossy) if "tensors" in last else "no output"

    return roundtrip, encode_only, check


# --- driver ---------------------------------------------------------------------------------

CODECS: list[tuple[str, str | CodecSpec, str]] = [
    ("raw", "raw", "weights"),
    ("zstd", "zstd", "weights"),
    ("zstd-plain", "zstd-plain", "weights"),
    ("zstd delta", "zstd", "delta"),
    ("bf16 delta", "bf16", "delta"),
    ("fp16 delta", "fp16", "delta"),
    ("auto@100Mbit", CodecSpec("auto", link=LinkProfile.mbit(100)), "weights"),
    ("auto@10Gbit", CodecSpec("auto", link=LinkProfile.mbit(10_000)), "weights"),
]


def run_size(label: str, scale: float, reps: int, rows: list[tuple[str, str, float, float, str, list[float]]],
             figures: dict[str, Any]) -> None:
    shapes = resnet50_shapes(scale)
    weights = trained_like(shapes)
    delta = nearby_delta(weights)
    size = nbytes(weights)
    params = sum(math.prod(s) for _, s, _ in shapes)
    wire: dict[str, int] = {}
    fns: dict[str, Callable[[], Any]] = {
        "memcpy": memcpy_fn(weights),
        "crc floor": crc_floor_fn(weights),
        "receiver-crc floor": receiver_crc_floor_fn(weights),
        "torch.save+load": torch_save_fn(weights),
        "pickle 5 oob buffers": pickle5_fn(weights),
        "zstandard alone": zstd_library_fn(weights, False, wire, "zstandard alone"),
        "zstandard + numpy shuffle": zstd_library_fn(weights, True, wire, "zstandard + numpy shuffle"),
    }
    peers = {"safetensors bytes": safetensors_fn(weights), "flower ndarrays": flower_fn(weights),
             "hivemind": hivemind_fn(weights), "xxh3 floor": xxh3_floor_fn(weights)}
    for name, fn in peers.items():
        if fn is not None:
            fns[name] = fn
    checks: dict[str, Callable[[], str | None]] = {}
    for name, codec, which in CODECS:
        sd = weights if which == "weights" else delta
        fns[name], fns[f"{name} (encode)"], checks[name] = ours_fns(sd, codec, wire, name)
    fns["raw fresh"], _, checks["raw fresh"] = ours_fns(weights, "raw", wire, "raw fresh", reuse=False,
                                                        zero_copy=False)
    # The same entries at 1/8 of the channels (~2% of the bytes): its round trip is mostly the
    # per-tensor cost (headers, checks, allocation lookups), the part a format cannot amortise.
    tiny = trained_like([(n, s if len(s) < 2 else (max(s[0] // 8, 8), max(s[1] // 8, 8), *s[2:]), d)
                         for n, s, d in shapes])
    fns["raw tiny"], _, checks["raw tiny"] = ours_fns(tiny, "raw", wire, "raw tiny")
    per_round: dict[str, list[float]] = {}
    failures = Failures()
    t = race(fns, reps, rounds=per_round, checks=checks, failures=failures)

    def ratio_spread(num: str, den: str) -> list[float]:
        """[min, median, max] of ``num``'s time / ``den``'s per round (each round's median of
        each): a round where ``den`` failed (infinite) is 0, where only ``num`` did infinite."""
        return spread([0.0 if math.isinf(b) else a / b
                       for a, b in zip(per_round[num], per_round[den], strict=True)])

    def gbps_spread(name: str) -> list[float]:
        return spread([size / x / 1e9 for x in per_round[name]])

    notes = {"memcpy": "reference: copy into an existing buffer",
             "crc floor": "crc32 + copy + crc32 per 1 MiB block, no vcasync code",
             "receiver-crc floor": "copy + crc32 per 1 MiB block: no sender's checksum",
             "xxh3 floor": "the same with xxh3-128: what another checksum would buy",
             "torch.save+load": "BytesIO, weights_only=True", "pickle 5 oob buffers":
             "dumps + copy buffers + loads", "safetensors bytes": "save + load",
             "zstandard alone": "level 1, frame per tensor", "zstandard + numpy shuffle": "level 1",
             "raw fresh": "new tensors each time, bytes chunks (cold)",
             "raw tiny": "the same entries at 1/8 of the channels: per-tensor cost"}
    for name in fns:
        if name.endswith("(encode)"):
            continue
        data = delta if any(name == n and w == "delta" for n, _, w in CODECS) else weights
        data = tiny if name == "raw tiny" else data
        ratio = nbytes(data) / wire[name] if name in wire else 1.0
        note = notes.get(name, "")
        if f"{name} (encode)" in t:
            enc = t[f"{name} (encode)"]
            note = f"enc {enc * 1e3:.0f} ms, dec {max(t[name] - enc, 0) * 1e3:.0f} ms"
        shown = name if name in notes and not name.startswith("raw") else (
            f"vcasync {name}" if name in wire and not name.startswith("zstandard") else name)
        rows.append((label, shown, t[name], ratio, note, spread(per_round[name], 6)))
    for name in ("flower ndarrays", "hivemind"):
        if name not in fns:
            rows.append((label, name, math.nan, math.nan, "not installed: skipped", [math.nan] * 3))

    mem = t["memcpy"]
    figures.update({
        f"raw_vs_memcpy_{label}": mem / t["raw"],
        f"raw_vs_memcpy_spread_{label}": ratio_spread("memcpy", "raw"),
        f"crc_floor_vs_memcpy_{label}": mem / t["crc floor"],
        f"crc_floor_vs_memcpy_spread_{label}": ratio_spread("memcpy", "crc floor"),
        f"receiver_crc_floor_vs_memcpy_{label}": mem / t["receiver-crc floor"],
        f"receiver_crc_floor_vs_memcpy_spread_{label}": ratio_spread("memcpy", "receiver-crc floor"),
        f"raw_vs_crc_floor_{label}": t["crc floor"] / t["raw"],
        f"raw_vs_crc_floor_spread_{label}": ratio_spread("crc floor", "raw"),
        f"xxh3_floor_vs_memcpy_{label}": mem / t["xxh3 floor"] if "xxh3 floor" in t else None,
        f"xxh3_floor_vs_memcpy_spread_{label}": (ratio_spread("memcpy", "xxh3 floor")
                                                  if "xxh3 floor" in t else None),
        f"zstd_vs_library_spread_{label}": ratio_spread("zstandard + numpy shuffle", "zstd"),
        f"raw_vs_torch_save_{label}": t["torch.save+load"] / t["raw"],
        f"raw_vs_torch_save_spread_{label}": ratio_spread("torch.save+load", "raw"),
        f"zstd_vs_library_{label}": t["zstandard + numpy shuffle"] / t["zstd"],
        f"zstd_plain_vs_library_{label}": t["zstandard alone"] / t["zstd-plain"],
        f"zstd_plain_vs_library_spread_{label}": ratio_spread("zstandard alone", "zstd-plain"),
        f"zstd_weights_ratio_{label}": size / wire.get("zstd", math.nan),
        f"zstd_plain_weights_ratio_{label}": size / wire.get("zstd-plain", math.nan),
        f"zstd_delta_ratio_{label}": nbytes(delta) / wire.get("zstd delta", math.nan),
        f"bf16_delta_ratio_{label}": nbytes(delta) / wire.get("bf16 delta", math.nan),
        f"fp16_delta_ratio_{label}": nbytes(delta) / wire.get("fp16 delta", math.nan),
        f"raw_fresh_vs_memcpy_{label}": mem / t["raw fresh"],
        f"raw_fresh_vs_memcpy_spread_{label}": ratio_spread("memcpy", "raw fresh"),
        f"per_tensor_us_{label}": t["raw tiny"] / len(tiny) * 1e6,
        f"per_tensor_us_spread_{label}": spread([x / len(tiny) * 1e6 for x in per_round["raw tiny"]]),
        f"per_tensor_share_{label}": t["raw tiny"] / t["raw"],
        f"per_tensor_share_spread_{label}": ratio_spread("raw tiny", "raw"),
        f"torch_save_vs_memcpy_{label}": mem / t["torch.save+load"],
        f"torch_save_vs_memcpy_spread_{label}": ratio_spread("memcpy", "torch.save+load"),
        f"pickle5_vs_memcpy_{label}": mem / t["pickle 5 oob buffers"],
        f"pickle5_vs_memcpy_spread_{label}": ratio_spread("memcpy", "pickle 5 oob buffers"),
        f"auto_100mbit_ratio_{label}": size / wire.get("auto@100Mbit", math.nan),
        f"auto_10gbit_ratio_{label}": size / wire.get("auto@10Gbit", math.nan),
        f"memcpy_gbps_{label}": size / mem / 1e9,
        f"memcpy_gbps_spread_{label}": gbps_spread("memcpy"),
        f"raw_gbps_{label}": size / t["raw"] / 1e9,
        f"raw_gbps_spread_{label}": gbps_spread("raw"),
        f"zstd_gbps_{label}": size / t["zstd"] / 1e9,
        f"zstd_gbps_spread_{label}": gbps_spread("zstd"),
        f"failed_{label}": failures.total(),
        f"failures_{label}": {n: {"count": c, "first": failures.first[n]} for n, c in failures.count.items()},
        f"params_{label}": params,
        f"bytes_{label}": size,
    })
    for name in ("safetensors bytes", "flower ndarrays", "hivemind"):
        if name in t:
            figures[f"{name.split()[0]}_vs_memcpy_{label}"] = mem / t[name]
            figures[f"{name.split()[0]}_vs_memcpy_spread_{label}"] = ratio_spread("memcpy", name)


SCALES = {"6m": 0.5, "25m": 1.0, "100m": 2.0}
QUICK: dict[str, Any] = {"sizes": "6m", "reps": 3}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    add_quick(ap, QUICK, "ResNet-50 at half width (~6M params), 3 reps")
    ap.add_argument("--sizes", type=one_of(list(SCALES)), default="25m,100m",
                    help=f"comma list of {', '.join(SCALES)} (default 25m,100m)")
    ap.add_argument("--reps", type=positive_int, default=5, help="repetitions per figure (default 5)")
    ap.add_argument("--clock", choices=sorted(CLOCK), default="cpu",
                    help="cpu: this thread's CPU time (default), wall: elapsed time")
    ap.add_argument("--json", action="store_true", help="print one JSON object on the last line")
    return parse_args(ap, argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    global clock
    clock = CLOCK[args.clock]
    torch.set_num_threads(1)
    sizes = [s.strip() for s in args.sizes.split(",")]
    reps = args.reps
    rows: list[tuple[str, str, float, float, str, list[float]]] = []
    figures: dict[str, Any] = {}
    for label in sizes:
        run_size(label, SCALES[label], reps, rows, figures)
    headline = sizes[-1]
    order = ["raw_vs_memcpy", "raw_vs_memcpy_spread", "crc_floor_vs_memcpy", "crc_floor_vs_memcpy_spread",
             "receiver_crc_floor_vs_memcpy", "receiver_crc_floor_vs_memcpy_spread",
             "xxh3_floor_vs_memcpy", "xxh3_floor_vs_memcpy_spread", "raw_vs_crc_floor",
             "raw_vs_crc_floor_spread", "per_tensor_us", "per_tensor_us_spread", "per_tensor_share",
             "per_tensor_share_spread", "raw_vs_torch_save", "raw_vs_torch_save_spread",
             "zstd_vs_library", "zstd_vs_library_spread", "zstd_weights_ratio", "bf16_delta_ratio"]
    result = {k: figures[f"{k}_{headline}"] for k in order}
    result = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in result.items()}
    result.update({k: (round(v, 3) if isinstance(v, float) else v) for k, v in figures.items()})
    result["mode"] = "warm: destinations allocated once and reused; medians after one warm-up"
    result["headline_size"] = headline
    result["reps"] = reps
    # calls (warm-ups included) that raised or decoded wrong: each is an infinite time in its
    # median, so a figure that depends on it sinks (or is null), never a figure without it
    result["failed"] = sum(figures[f"failed_{label}"] for label in sizes)
    result["config"] = "ResNet-50 tensor list, codec presets as listed, chunk 1 MiB, 1 torch thread"
    result["clock"] = args.clock
    print(f"{'size':>5}  {'method':<28} {'time ms median (min-max)':>26} {'GB/s':>7} {'ratio':>7}  note")
    for label, name, secs, ratio, note, three in rows:
        speed = figures[f"bytes_{label}"] / secs / 1e9 if secs == secs else math.nan
        shown = f"{secs * 1e3:.1f} ({three[0] * 1e3:.1f}-{three[2] * 1e3:.1f})" if secs == secs else "-"
        print(f"{label:>5}  {name:<28} {shown:>26} {speed:7.2f} {ratio:7.3f}  {note}")
    print("(time: the median call; min-max: of the rounds' medians, the rounds the ratios' spreads "
          "pair; compression ratios are byte counts, the same every repetition)")
    print("\n" + "  ".join(f"{k}={result[k]}" for k in order))
    for label in sizes:
        for name, what in figures[f"failures_{label}"].items():
            print(f"FAILED {label} {name}: {what['count']} call(s), first: {what['first']}")
    if args.json:
        print(json.dumps(finite(result)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
