"""Choosing a codec per tensor: :class:`CodecSpec`, :class:`LinkProfile` and the named presets.

A :class:`CodecSpec` says how a payload should be encoded: ``compression`` is ``"raw"``, ``"zstd"``
or ``"auto"``; ``shuffle`` adds the byte-plane shuffle before zstd; ``lossy`` (opt-in, meant for
deltas) downcasts float32/float64 tensors to ``"float16"`` or ``"bfloat16"`` first.

``"auto"`` decides per tensor *and* per link: compression only pays when the time it saves on the
wire exceeds the time it costs on both CPUs. So for each tensor (above ``min_bytes``) it compresses
a small sample (at most 1/16 of it: one slice, or three 64 KiB slices spread over a tensor of
1 MiB or more), measures the ratio and the compress and decompress speeds on that sample, and
compares ``n/B`` with ``n/c + n/(r*B) + n/d`` for the link's bandwidth ``B``; zstd must save at
least ``1 - margin`` (3 %) of the time. On loopback or a fast LAN that picks raw; on a slow WAN
uplink it picks zstd; an incompressible tensor stays raw everywhere.

The lossy bound: a finite float32/64 value ``x`` in range decodes to ``y`` with
``|y - x| <= |x| * 2**-8`` (bfloat16) or ``|x| * 2**-11`` (float16), plus half the smallest
subnormal of the target (``2**-134`` / ``2**-25``) near zero; NaN and +-Inf survive. A tensor whose
finite values would overflow float16 is sent at full precision instead.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field, replace
from typing import Any, Final

import numpy as np
import torch

from .._registry import Registry
from ..errors import ConfigError
from .codecs import block_codec, shuffle_into
from .dtypes import LOSSY_TARGETS, dtype_name

__all__ = [
    "CodecSpec",
    "LinkProfile",
    "TensorPlan",
    "codec_names",
    "lossy_bound",
    "plan_tensor",
    "register_codec",
    "resolve_codec",
]

_SAMPLE_BYTES: Final = 64 << 10      # one sampled slice at most
_SAMPLE_SHARE: Final = 16            # ... and at most 1/16 of the tensor, but at least:
_SAMPLE_MIN: Final = 4 << 10
_SAMPLES: Final = 3                  # slices spread over tensors of 1 MiB and more


@dataclass(frozen=True, slots=True)
class LinkProfile:
    """What one network link can carry, in bytes per second (measure it; don't guess)."""

    bandwidth: float
    name: str = ""

    def __post_init__(self) -> None:
        if not (isinstance(self.bandwidth, (int, float)) and self.bandwidth > 0):
            raise ConfigError(f"LinkProfile.bandwidth must be > 0 bytes/s, got {self.bandwidth!r}")

    @classmethod
    def mbit(cls, megabits_per_s: float, name: str = "") -> LinkProfile:
        return cls(megabits_per_s * 1e6 / 8, name or f"{megabits_per_s:g} Mbit/s")

    @classmethod
    def from_transfer(cls, nbytes: int, seconds: float, name: str = "measured") -> LinkProfile:
        """A profile from one observed transfer (e.g. the last upload's size and duration)."""
        return cls(max(nbytes, 1) / max(seconds, 1e-9), name)


#: A link when ``auto`` is given none: 1 Gbit/s, where zstd level 1 rarely pays for float weights.
DEFAULT_LINK: Final = LinkProfile.mbit(1000, "default 1 Gbit/s")


@dataclass(frozen=True, slots=True)
class CodecSpec:
    """How to encode a payload; see the module docstring. Immutable, so safe to share."""

    compression: str = "raw"
    level: int = 1
    shuffle: bool = True
    lossy: str | None = None
    threads: int = 0
    link: LinkProfile | None = None
    min_bytes: int = 4096
    margin: float = 0.97

    def __post_init__(self) -> None:
        if self.compression != "auto":
            block_codec(self.compression)  # raises for unknown names
        if self.lossy is not None and self.lossy not in LOSSY_TARGETS:
            raise ConfigError(f"CodecSpec.lossy must be None or one of {sorted(LOSSY_TARGETS)}, "
                              f"got {self.lossy!r}")
        if not -7 <= self.level <= 22:
            raise ConfigError(f"CodecSpec.level must be in -7..22, got {self.level}")
        if self.threads < 0:
            raise ConfigError(f"CodecSpec.threads must be >= 0, got {self.threads}")


@dataclass(frozen=True, slots=True)
class TensorPlan:
    """The decision for one tensor: block codec, level, shuffle, and the dtype on the wire."""

    codec: str
    level: int = 1
    shuffle: bool = False
    wire_dtype: torch.dtype | None = None
    threads: int = 0
    stats: dict[str, float] = field(default_factory=dict, compare=False)


def _validate_spec(name: str, obj: object) -> CodecSpec:
    if not isinstance(obj, CodecSpec):
        raise ConfigError(f"codec {name!r} must be a CodecSpec, got {type(obj).__name__}")
    return obj


def _unknown_codec(name: object, known: list[str]) -> ConfigError:
    return ConfigError(f"unknown codec {name!r}; known: {known}")


def _missing_codec(name: str, path: str, exc: ImportError) -> ConfigError:
    return ConfigError(f"the codec {name!r} ({path}) cannot be imported: {exc}")


#: Preset name -> :class:`CodecSpec`, so configs can say ``codec = "zstd"``: the same Registry as
#: policies and backends (third parties: :func:`register_codec` or the ``vcasync.codecs`` group).
_PRESETS: Final = Registry[CodecSpec](
    "vcasync.codecs", validate=_validate_spec, missing=_missing_codec, unknown=_unknown_codec,
    broken=lambda name, problem: ConfigError(f"the codec {name!r}: {problem}"),
    duplicate=lambda name: ConfigError(f"codec {name!r} is already registered"))
for _name, _spec in {
    "raw": CodecSpec("raw"),
    "zstd": CodecSpec("zstd", level=1, shuffle=True),
    "zstd-plain": CodecSpec("zstd", level=1, shuffle=False),
    "auto": CodecSpec("auto", level=1, shuffle=True),
    "bf16": CodecSpec("zstd", level=1, shuffle=True, lossy="bfloat16"),
    "fp16": CodecSpec("zstd", level=1, shuffle=True, lossy="float16"),
    "bf16-raw": CodecSpec("raw", lossy="bfloat16"),
    "fp16-raw": CodecSpec("raw", lossy="float16"),
}.items():
    _PRESETS.register(_name, _spec)
del _name, _spec


def register_codec(name: str, spec: CodecSpec, *, replace: bool = False) -> None:
    """Name a :class:`CodecSpec` so configs can say ``codec = "name"``."""
    _PRESETS.register(name, spec, replace=replace)


def codec_names() -> list[str]:
    return _PRESETS.names()


def resolve_codec(codec: str | CodecSpec, *, link: LinkProfile | None = None) -> CodecSpec:
    """A :class:`CodecSpec` from a preset name or a spec; ``link`` fills in an ``auto`` spec's."""
    spec = codec if isinstance(codec, CodecSpec) else _PRESETS.get(codec)
    if link is not None and spec.link is None:
        spec = replace(spec, link=link)
    return spec


def lossy_bound(target: torch.dtype) -> tuple[float, float]:
    """``(relative, absolute)`` error bound of a downcast to ``target`` (see module docstring)."""
    if target == torch.bfloat16:
        return 2.0**-8, 2.0**-134
    if target == torch.float16:
        return 2.0**-11, 2.0**-25
    raise ConfigError(f"no lossy bound for {target}")


def wire_dtype_for(spec: CodecSpec, t: torch.Tensor) -> torch.dtype | None:
    """The downcast target for ``t`` under ``spec``, or None to send it as it is."""
    if spec.lossy is None or not t.is_floating_point():
        return None
    target = LOSSY_TARGETS[spec.lossy]
    if t.dtype.itemsize <= target.itemsize:
        return None
    return target


def plan_tensor(spec: CodecSpec, data: np.ndarray[Any, Any], itemsize: int,
                wire_dtype: torch.dtype | None = None, *, total: int | None = None) -> TensorPlan:
    """Decide how to send one tensor whose wire bytes are ``data`` (uint8, contiguous), or a
    sample of them when ``total`` (the full wire size) is given."""
    if spec.compression != "auto":
        return _fixed_plan(spec, itemsize, wire_dtype)
    n = data.shape[0] if total is None else total
    shuffle = spec.shuffle and itemsize > 1
    if n < spec.min_bytes:
        return TensorPlan("raw", wire_dtype=wire_dtype)
    ratio, c_speed, d_speed = _measure_sample(data, itemsize, shuffle, spec.level)
    link = spec.link or DEFAULT_LINK
    t_raw = n / link.bandwidth
    t_zstd = n / c_speed + n / (ratio * link.bandwidth) + n / d_speed
    stats = {"ratio": ratio, "compress_Bps": c_speed, "decompress_Bps": d_speed,
             "t_raw": t_raw, "t_zstd": t_zstd}
    if t_zstd < t_raw * spec.margin:
        return TensorPlan("zstd", spec.level, shuffle, wire_dtype, spec.threads, stats)
    return TensorPlan("raw", wire_dtype=wire_dtype, stats=stats)


@functools.lru_cache(maxsize=256)
def _fixed_plan(spec: CodecSpec, itemsize: int, wire_dtype: torch.dtype | None) -> TensorPlan:
    """The same decision for every tensor of an item size: computed once (plans are immutable)."""
    zstd = spec.compression != "raw"
    return TensorPlan(spec.compression, spec.level, spec.shuffle and zstd and itemsize > 1,
                      wire_dtype, spec.threads)


def _measure_sample(data: np.ndarray[Any, Any], itemsize: int, shuffle: bool,
                    level: int) -> tuple[float, float, float]:
    """Ratio and compress/decompress speeds (bytes/s) of zstd on a few slices of ``data``."""
    import zstandard

    n = data.shape[0]
    size = min(_SAMPLE_BYTES, max(_SAMPLE_MIN, n // _SAMPLE_SHARE), n) // itemsize * itemsize
    count = _SAMPLES if n >= (1 << 20) else 1
    starts = [((n - size) * i // max(count - 1, 1)) // itemsize * itemsize for i in range(count)]
    cctx = zstandard.ZstdCompressor(level=level)
    dctx = zstandard.ZstdDecompressor()
    scratch = np.empty(size, dtype=np.uint8)
    raw = packed = 0
    c_time = d_time = 0.0
    for s in starts:
        block = data[s:s + size]
        t0 = time.perf_counter()
        if shuffle:
            block = shuffle_into(block, itemsize, scratch)
        wire = cctx.compress(block.data)
        t1 = time.perf_counter()
        dctx.decompress(wire)
        t2 = time.perf_counter()
        raw += size
        packed += len(wire)
        c_time += t1 - t0
        d_time += t2 - t1
    tiny = 1e-9
    return raw / max(packed, 1), raw / max(c_time, tiny), raw / max(d_time, tiny)


def describe(spec: CodecSpec) -> str:
    """A short human-readable name for a spec, for logs and benchmark tables."""
    parts = [spec.compression]
    if spec.compression != "raw":
        parts.append(f"l{spec.level}")
        if spec.shuffle:
            parts.append("shuffle")
    if spec.lossy:
        parts.append(dtype_name(LOSSY_TARGETS[spec.lossy]))
    if spec.link is not None:
        parts.append(f"@{spec.link.name or f'{spec.link.bandwidth:.3g}B/s'}")
    return "+".join(parts)

