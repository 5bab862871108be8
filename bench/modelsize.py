"""Ingest time and coordinator memory against model size
(``python -m bench.modelsize [--quick] [--json] [--max-size 4GB [--spool]]``).

For each size (10 MB, 100 MB, 1 GB by default; 4 GB only with ``--max-size 4GB``, when memory allows:
on a 24 GiB machine with ``--spool`` too, since the coordinator (about 3 model sets at 4 GB, 4
while a snapshot is written during merges) and this process (the delta, and the payload unless
spooled) share it. Not a default for memory, not time: the row took under 5 minutes on 2 cores
with ``--reps 1``, but the default in-memory upload does not fit beside the coordinator there),
a real coordinator process (the default ``journal`` durability on a ``file://`` store, ``vcasgd``,
``max_staleness`` 8) serves a model with a ResNet-50 state dict's layout (320 tensors, channels scaled
to the size, int64 counters included). This process uploads fp32 delta results (``raw`` codec)
until the staleness window is full (8 + 2 warm-up uploads, so retained versions and recycled buffers
are at their steady state) while ``--held`` (default 8) more leases stay open, one taken on each of
the last versions by a worker of its own, as slow workers still training would hold them (a
worker holds at most 4 leases by default): the coordinator keeps a version
only while a result may still be based on it, so this is the window full, the memory an operator
plans for (``--held 0``: one worker, only the current version kept). Then ``--reps`` measured
ones, then ``--reps`` bf16 delta uploads (codec ``bf16``: bf16 + shuffle + zstd-1). One upload's
ingest time runs from the first byte sent until the receipt is back and the new version is
served; the payload is encoded into memory before (``--spool``: into a file it is then uploaded
from, as a worker does). Memory: the coordinator's resident set after the uploads and its peak
(``VmHWM``), each read from the coordinator process itself.

Figures (``--json``, last line): ``ingest_linearity`` (median seconds per model byte at the largest
size / at 100 MB: 1.0 is linear, below is better than linear; null, with a reason, when no size is
above 100 MB, as in ``--quick``), ``ingest_linearity_small`` (the same, 100 MB / the smallest size),
each with ``_spread``: the [min, median, max] of the same ratio per repetition (the i-th measured
upload at one size over the i-th at the other, both after the same warm-up), ``rss_multiple_max``
(the coordinator's peak RSS over the whole run / model bytes at the largest size) with
``_spread``: the [min, median, max] of each measured fp32 upload's own peak (the coordinator's
peak is reset before the upload and read after it, through ``/proc/self/clear_refs``; absent where
the kernel does not allow it) / model bytes; ``centres`` says what each of these figures is beside
its spread. Per size: ``ingest_s_<size>`` with ``_min`` / ``_max``, ``ingest_gbps_<size>``,
``bf16_ingest_s_<size>`` (each of the two with ``_spread``), ``rss_mb_<size>``,
``rss_peak_mb_<size>``, ``rss_multiple_<size>`` (with ``_spread`` as above), ``failed_<size>``
(uploads that failed or timed out: counted, and their time is infinite in the figures, null in the
JSON, never dropped; plus 1 when the size's coordinator did not stop cleanly,
``stop_failed_<size>``).

``--resume``: after each size a second coordinator is started on the same store, resuming from
the first one's final snapshot, and its peak RSS reported (``resume_rss_peak_mb_<size>``,
``resume_rss_multiple_<size>``: peak / model bytes; the peak includes the model the process builds
and hands the coordinator, as ``vcasync coordinator`` does, and the resume itself).

After each size the coordinator is sent SIGTERM and given ``stop_grace_s`` (120 s plus the model at
25 MB/s: 280 s at 4 GB) to write its final snapshot; one still running then is killed and counted
as failed. Its ``file://`` store and the spooled payloads live in one temporary directory of this
process, removed after every size however the run ended (an error, Ctrl-C, SIGTERM).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import torch

from vcasync._loop import run
from vcasync.wire import encode_payload
from vcasync.worker._client import CoordinatorClient
from vcasync.worker._io import spool_result

from ._peers import SECRET, bench_delta, bench_model
from ._proc import PeerExit, peer
from ._signals import exit_with, raise_if_stopped, restores_sigterm, stop_on_sigterm
from ._stats import add_quick, finite, non_negative_int, parse_args, positive_int, spread

STALENESS = 8
OP_TIMEOUT_S = 900.0
_UNITS = {"KB": 10**3, "MB": 10**6, "GB": 10**9}
DEFAULT_SIZES = ("10MB", "100MB", "1GB", "4GB")
#: The coordinator's stop after SIGTERM (its final snapshot): this long, plus the model at this rate.
STOP_BASE_S = 120.0
SLOWEST_WRITE_BPS = 25e6



def parse_size(text: str) -> int:
    """``"100MB"`` -> 100_000_000 (decimal units)."""
    t = text.strip().upper()
    for unit, mult in _UNITS.items():
        if t.endswith(unit):
            return int(float(t[: -len(unit)]) * mult)
    raise argparse.ArgumentTypeError(f"size {text!r}: use a number and KB, MB or GB")


def encode_whole(kind: str, meta: dict[str, Any], tensors: dict[str, torch.Tensor],
                 codec: str) -> bytearray:
    """The whole payload in one buffer, grown as it is encoded (zero-copy pieces appended):
    ``b"".join`` of the encoder's chunks held the chunks and the joined copy at once, twice the
    payload, which at 4 GB no longer fitted beside the coordinator on a 24 GiB machine."""
    buf = bytearray()
    for piece in encode_payload(kind, meta, tensors, codec=codec, zero_copy=True):
        buf += piece
    return buf


class Uploader:
    """One delta result per call: lease, encode (before the clock starts), upload, wait merged.
    ``spool``: a directory the payload is written to and uploaded from (as a worker does), so this
    process holds the delta only, not the payload too."""

    def __init__(self, url: str, params: int, spool: Path | None = None) -> None:
        self.url = url
        self.spool = spool
        self.delta = bench_delta(bench_model(params, arch="resnet50"))
        self.model_bytes = sum(t.numel() * t.element_size() for t in self.delta.values())

    async def once(self, client: CoordinatorClient, http: aiohttp.ClientSession, codec: str) -> float:
        grant = await client.lease()
        meta = {"lease_id": grant.lease_id, "base_version": grant.base_version, "kind": "delta",
                "samples": 1, "steps": 1, "partial": False, "metrics": {}}
        if self.spool is None:
            data: bytearray | Path = await asyncio.to_thread(encode_whole, "result", meta,
                                                             self.delta, codec)
        else:
            data = self.spool / "result"
            await spool_result(data, meta, self.delta, codec)   # the worker's own spooling
        t0 = time.perf_counter()
        receipt = await client.submit(grant.lease_id, data)
        del data
        async with http.get(f"{self.url}/bench/merged", params={"version": str(receipt.version)}) as r:
            if (await r.json())["version"] < receipt.version:
                raise RuntimeError(f"version {receipt.version} was never served")
        if receipt.status != "accepted":
            raise RuntimeError(f"the coordinator did not accept the result: {receipt}")
        return time.perf_counter() - t0


async def _timed(op: Any) -> float:
    try:
        async with asyncio.timeout(OP_TIMEOUT_S):
            return float(await op)
    except Exception as exc:     # a failed or timed-out upload counts, with an infinite time
        print(f"  upload failed: {exc!r}", file=sys.stderr)
        return math.inf


async def measure(url: str, params: int, reps: int, warmup: int, held: int,
                  spool: Path | None = None) -> dict[str, Any]:
    up = Uploader(url, params, spool)
    async with contextlib.AsyncExitStack() as slow, \
            CoordinatorClient(url, timeout_s=OP_TIMEOUT_S) as client, \
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=OP_TIMEOUT_S)) as http:
        await client.join(SECRET, "bench")
        for i in range(warmup):
            raise_if_stopped()
            if i >= warmup - held:   # a slow worker of its own leases the current version and trains on
                # (one worker each: a worker holds at most max_leases_per_worker, 4 by default)
                worker = await slow.enter_async_context(CoordinatorClient(url, timeout_s=OP_TIMEOUT_S))
                await worker.join(SECRET, f"slow-{i}")
                await worker.lease()
            await up.once(client, http, "raw")
        raw: list[float] = []
        bf16: list[float] = []
        # the peak of each measured fp32 upload: the coordinator's peak is reset before it and
        # read after it; the run's peak is the largest of every read (warm-ups included)
        mem = await _rss(url, http, reset=True)
        run_peak, peaks, resets = mem["rss_peak"], [], bool(mem.get("reset"))
        for times, codec in ((raw, "raw"), (bf16, "bf16")):
            for _ in range(reps):
                raise_if_stopped()
                times.append(await _timed(up.once(client, http, codec)))
                mem = await _rss(url, http, reset=True)
                run_peak = max(run_peak, mem["rss_peak"])
                resets = resets and bool(mem.get("reset"))
                if codec == "raw":
                    peaks.append(mem["rss_peak"])
        mem = await _rss(url, http)
    return {"bytes": up.model_bytes, "raw": raw, "bf16": bf16, "rss": mem["rss"],
            "rss_peak": max(run_peak, mem["rss_peak"]), "rss_peaks": peaks if resets else None}


def label(size: int) -> str:
    return f"{size // 10**9}gb" if size >= 10**9 else f"{size // 10**6}mb"


QUICK: dict[str, Any] = {"max_size": "100MB", "reps": 2}   # strings go through the type


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--max-size", type=parse_size, default=parse_size("1GB"),
                   help="the largest model (default 1GB; 4GB needs about 20 GB of free memory "
                        "with --spool)")
    p.add_argument("--reps", type=positive_int, default=3)
    p.add_argument("--warmup", type=non_negative_int, default=STALENESS + 2,
                   help="uploads before measuring (default: the staleness window + 2)")
    p.add_argument("--held", type=non_negative_int, default=None,
                   help="leases left open, one per version, as slow workers hold them (default: "
                        "the staleness window, 8, or --warmup if that is fewer)")
    p.add_argument("--spool", action="store_true",
                   help="upload each result from a file it is first written to, as a worker does, "
                        "instead of from memory: this process then holds the delta only (what "
                        "lets 4GB fit on a 24 GiB machine)")
    p.add_argument("--resume", action="store_true",
                   help="after each size, start a second coordinator on its store (it resumes from "
                        "the final snapshot) and report its peak RSS (resume_rss_multiple_<size>)")
    add_quick(p, QUICK, "10 MB and 100 MB only, 2 reps")
    p.add_argument("--json", action="store_true")
    a = parse_args(p, argv)
    if a.held is None:
        a.held = min(STALENESS, a.warmup)
    if not 0 <= a.held <= a.warmup:
        p.error(f"--held must be between 0 and --warmup ({a.warmup}), got {a.held}")
    if a.max_size < parse_size("100MB"):
        p.error(f"--max-size must be at least 100MB (the linearity reference), got {a.max_size:,} bytes")
    return a


def stop_grace_s(model_bytes: int) -> float:
    """How long the coordinator may take to stop after SIGTERM: its final snapshot writes (and
    fsyncs) the whole model, so the grace grows with it: 120 s, plus the model at
    ``SLOWEST_WRITE_BPS`` (4 GB: 280 s; a fixed 20 s killed it mid-write from about 1 GB on)."""
    return STOP_BASE_S + model_bytes / SLOWEST_WRITE_BPS


def measure_size(size: int, a: argparse.Namespace) -> dict[str, Any]:
    """One size: a coordinator of its own, the uploads, then its stop (``stop_failed``: 1 when it
    had to be killed or exited non-zero, counted in ``failed``). Everything on disk (the
    coordinator's ``file://`` store, the spooled payloads) lives in one temporary directory of this
    process, removed once the coordinator is gone, whatever ended the run."""
    params = size // 4
    stopped = PeerExit()
    with tempfile.TemporaryDirectory(prefix="vcasync-bench-modelsize-") as tmp:
        work = Path(tmp)
        (work / "spool").mkdir()
        args = ("coordinator", "--params", str(params), "--arch", "resnet50", "--durability",
                "journal", "--max-staleness", str(STALENESS), "--units",
                str(a.warmup + a.held + 2 * a.reps + 4), "--store-dir", str(work / "store"))
        with peer(*args, timeout=600.0, stop_timeout=stop_grace_s(size), stopped=stopped) as url:
            result = run(measure(url, params, a.reps, a.warmup, a.held,
                                 work / "spool" if a.spool else None))
        raise_if_stopped()
        _say_if_failed(size, stopped, "")
        result["stop_failed"] = int(stopped.failed)
        if a.resume and not stopped.failed:
            # a second coordinator on the same store: it resumes from the final snapshot
            again = PeerExit()
            with peer(*args, timeout=600.0, stop_timeout=stop_grace_s(size), stopped=again) as url:
                mem = run(_rss_once(url))
            _say_if_failed(size, again, "resumed ")
            result.update(resume_rss_peak=mem["rss_peak"], resume_version=mem["version"])
            result["stop_failed"] += int(again.failed)
    return result


async def _rss(url: str, http: aiohttp.ClientSession, reset: bool = False) -> dict[str, Any]:
    """The coordinator's memory; ``reset``: its peak is then reset to its resident set
    (``"reset"`` False where the kernel does not allow it)."""
    async with http.get(f"{url}/bench/rss", params={"reset": "1"} if reset else {}) as r:
        return dict(await r.json())


async def _rss_once(url: str) -> dict[str, Any]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=OP_TIMEOUT_S)) as http:
        return await _rss(url, http)


def _say_if_failed(size: int, stopped: PeerExit, which: str) -> None:
    if stopped.failed:
        how = "was killed" if stopped.killed else f"exited with {stopped.returncode}"
        print(f"  the {label(size)} {which}coordinator {how} after SIGTERM (its final snapshot was "
              f"not written within {stop_grace_s(size):.0f}s): counted as failed", file=sys.stderr)


@restores_sigterm
def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    stop_on_sigterm()
    sizes = [s for s in map(parse_size, DEFAULT_SIZES) if s <= a.max_size]
    results = {size: measure_size(size, a) for size in sizes}
    figures: dict[str, Any] = {}
    print(f"ingest against model size: ResNet-50 layout, journal durability, max_staleness "
          f"{STALENESS}, {a.warmup} warm-up uploads, {a.held} leases held open, {a.reps} measured "
          f"(min / median / max){', uploaded from spooled files' if a.spool else ''}")
    print(f"{'model':>8}{'fp32 s min/med/max':>26}{'GB/s':>7}{'bf16 s min/med/max':>22}{'RSS MB':>9}"
          f"{'peak MB':>9}{'x model':>9}{'failed':>8}")
    for size, r in results.items():
        tag = label(size)
        med = statistics.median(r["raw"])
        failed = sum(not math.isfinite(t) for t in r["raw"] + r["bf16"]) + r["stop_failed"]
        figures.update({
            f"ingest_s_{tag}": med, f"ingest_s_{tag}_min": min(r["raw"]),
            f"ingest_s_{tag}_max": max(r["raw"]), f"ingest_gbps_{tag}": r["bytes"] / med / 1e9,
            f"ingest_gbps_{tag}_spread": spread([r["bytes"] / t / 1e9 for t in r["raw"]], 4),
            f"bf16_ingest_s_{tag}": statistics.median(r["bf16"]),
            f"bf16_ingest_s_{tag}_spread": spread(r["bf16"], 4),
            f"rss_mb_{tag}": r["rss"] / 1e6, f"rss_peak_mb_{tag}": r["rss_peak"] / 1e6,
            f"rss_multiple_{tag}": r["rss_peak"] / r["bytes"],
            **({f"rss_multiple_{tag}_spread": spread([p / r["bytes"] for p in r["rss_peaks"]])}
               if r.get("rss_peaks") else {}),
            f"failed_{tag}": failed,
            f"stop_failed_{tag}": r["stop_failed"],
            **({f"resume_rss_peak_mb_{tag}": r["resume_rss_peak"] / 1e6,
                f"resume_rss_multiple_{tag}": r["resume_rss_peak"] / r["bytes"]}
               if "resume_rss_peak" in r else {}),
            f"model_mb_{tag}": r["bytes"] / 1e6})
        bf = spread(r["bf16"])
        print(f"{tag:>8}{min(r['raw']):>10.3f}{med:>8.3f}{max(r['raw']):>8.3f}"
              f"{r['bytes'] / med / 1e9:>7.3f}{bf[0]:>8.3f}{bf[1]:>7.3f}{bf[2]:>7.3f}"
              f"{r['rss'] / 1e6:>9.0f}{r['rss_peak'] / 1e6:>9.0f}{r['rss_peak'] / r['bytes']:>9.2f}"
              f"{failed:>8}")
        if r.get("rss_peaks"):
            lo, mid, hi = spread([p / r["bytes"] for p in r["rss_peaks"]], 2)
            print(f"{'':>8}peak of each measured fp32 upload: min {lo:.2f}, median {mid:.2f}, "
                  f"max {hi:.2f} x the model (the run's peak, warm-ups included: "
                  f"{r['rss_peak'] / r['bytes']:.2f})")
        if "resume_rss_peak" in r:
            print(f"{'':>8}resumed from its final snapshot: peak {r['resume_rss_peak'] / 1e6:.0f} MB, "
                  f"{r['resume_rss_peak'] / r['bytes']:.2f}x the model")
    largest, ref = sizes[-1], parse_size("100MB")
    per_byte = {s: statistics.median(results[s]["raw"]) / results[s]["bytes"] for s in sizes}
    # at 100 MB against itself the ratio is 1.0 whatever happened (it was, in --quick): no figure
    linearity = per_byte[largest] / per_byte[ref] if largest > ref else None
    top = results[largest]
    figures = {"ingest_linearity": linearity,
               **({"ingest_linearity_spread": spread(per_rep_linearity(top, results[ref]))}
                  if linearity is not None else {}),
               "rss_multiple_max": top["rss_peak"] / top["bytes"],
               **({"rss_multiple_max_spread": spread([p / top["bytes"] for p in top["rss_peaks"]])}
                  if top.get("rss_peaks") else {}),
               "largest": label(largest), "failed": sum(figures[f"failed_{label(s)}"] for s in sizes),
               **figures, "staleness": STALENESS, "held": a.held, "reps": a.reps, "warmup": a.warmup,
               "spool": a.spool, "resume": a.resume, "centres": CENTRES}
    if linearity is None:
        figures["reasons"] = {"ingest_linearity": "needs a size above 100 MB (--max-size); the "
                                                  "smallest size against 100 MB is ingest_linearity_small"}
    small = sizes[0] < ref
    figures["ingest_linearity_small"] = per_byte[ref] / per_byte[sizes[0]] if small else None
    if small:
        figures["ingest_linearity_small_spread"] = spread(per_rep_linearity(results[ref], results[sizes[0]]))
    said = "n/a (no size above 100 MB)" if linearity is None else (
        f"{linearity:.2f} (per repetition: {_three(figures['ingest_linearity_spread'])})")
    peaks = (f" (peak of each measured upload: {_three(figures['rss_multiple_max_spread'])})"
             if "rss_multiple_max_spread" in figures else "")
    print(f"ingest_linearity {said} (time per byte at {label(largest)} / at 100mb); rss_multiple_max "
          f"{figures['rss_multiple_max']:.2f}{peaks} (the run's peak RSS / model bytes at {label(largest)})")
    if a.json:
        print(json.dumps(finite(figures)))
    return 0


#: What ``ingest_linearity`` and ``rss_multiple_max`` are when they are not their spread's median
#: (``bench.publish`` says it beside them).
CENTRES = {"ingest_linearity": "ratio of the median times per byte",
           "ingest_linearity_small": "ratio of the median times per byte",
           "rss_multiple_max": "the run's peak (every upload, warm-ups included)"}


def per_rep_linearity(big: dict[str, Any], small: dict[str, Any]) -> list[float]:
    """Seconds per byte of each fp32 repetition at ``big`` over the same repetition (the i-th
    measured upload after the same warm-up) at ``small``: every repetition, none dropped (a failed
    one at ``big`` is infinite, one failed only at ``small`` 0)."""
    out = []
    for b, s in zip(big["raw"], small["raw"], strict=True):
        if math.isinf(b):
            out.append(math.inf)
        else:
            out.append((b / big["bytes"]) / (s / small["bytes"]))
    return out


def _three(values: list[float]) -> str:
    lo, mid, hi = values
    return f"min {lo:.2f}, median {mid:.2f}, max {hi:.2f}"


if __name__ == "__main__":
    torch.set_num_threads(1)
    exit_with(main, "bench.modelsize")
