"""Benchmark: put/get of one large object through each storage backend against direct calls.

    python -m bench.storage            # 400 MB, 5 repetitions after a warm-up
    python -m bench.storage --quick    # 64 MB, 3 repetitions
    python -m bench.storage --json     # ... and one JSON object on the last line

References, measured in the same run on the same bytes, alternating with the backend:

- ``local``: a plain file write + fsync, and a plain read (what any durable writer must do; the
  backend adds a rename and a directory fsync, which make it crash-safe);
- ``s3``: aiobotocore on the same moto server, making the same calls as the backend (a multipart
  upload with the same part size and concurrency for objects above the threshold); a single
  ``put_object`` is measured too, and the backend with its threshold raised to use it;
- ``gcs``: gcloud-aio-storage ``upload``/``download`` on the same gcp-storage-emulator.

``*_overhead`` = backend time / direct time - 1 for put + get (medians); ``*_overhead_paired``
the median of the same ratio taken within each repetition, and ``*_overhead_spread`` their
[min, median, max]; ``*_put_overhead`` / ``*_get_overhead`` each operation alone, with its
``_spread`` likewise; ``*_<put|get|ref_put|ref_get>_mb_s`` the median MB/s, with the
[min, median, max] of the repetitions' MB/s under ``_spread``. The emulators run in
child processes (moto not serialised); numbers are emulator-bound and only meaningful as ratios.
Mode: the same source buffer every repetition; each repetition creates a fresh object, reads it
back from a warm page cache, and deletes it (untimed), for backend and reference alike.

Failures: a put, get or delete that raises or takes longer than ``--timeout``, or a get that
returns other bytes than were put (compared outside the clock), warm-ups included, is counted in
``failed`` (``<backend>_failed``; the first errors in ``failures``) and its time is infinite in
the figures (null in the JSON), never left out: its MB/s is 0, and an overhead it is part of is
infinite when the backend's side failed, -1 when only the reference's did (a repetition where
both failed was NaN, which a median or a min/max could silently pass over).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._signals import exit_with, restores_sigterm, run_async, stop_on_sigterm
from ._stats import (
    add_quick,
    finite,
    non_negative_int,
    one_of,
    parse_args,
    positive_float,
    positive_int,
    show,
    spread,
)

MiB = 1 << 20
BUCKET = "vcasync-bench"

Op = Callable[[], Awaitable[object]]



@dataclass
class Pair:
    """One backend case and its reference: put and get each, timed alternately."""

    name: str
    put: Op
    get: Op
    clean: Op
    ref_put: Op
    ref_get: Op
    ref_clean: Op
    times: dict[str, list[float]] = field(default_factory=lambda: {
        "put": [], "get": [], "ref_put": [], "ref_get": []})
    failures: list[str] = field(default_factory=list)

    def median(self, what: str) -> float:
        return statistics.median(self.times[what])

    def overhead(self, what: str = "both") -> float:
        if what == "both":
            ours = self.median("put") + self.median("get")
            ref = self.median("ref_put") + self.median("ref_get")
        else:
            ours, ref = self.median(what), self.median(f"ref_{what}")
        return _over(ours, ref)

    def paired(self, what: str = "both") -> list[float]:
        """(put + get) / (reference put + get) - 1 of every repetition (none dropped); ``what``
        "put" or "get": that operation alone against the reference's."""
        t = self.times
        if what != "both":
            return [_over(o, r) for o, r in zip(t[what], t[f"ref_{what}"], strict=True)]
        return [_over(p + g, rp + rg) for p, g, rp, rg in
                zip(t["put"], t["get"], t["ref_put"], t["ref_get"], strict=True)]

    def mb_s(self, what: str, size: int) -> list[float]:
        """MB/s of every repetition of ``what`` (a failed one: 0, none dropped)."""
        return [size / MiB / s for s in self.times[what]]

    def paired_overhead(self) -> float:
        """Median over repetitions of (put + get) / (reference put + get) - 1: each ratio is taken
        within one repetition, so slow drift of a shared machine cancels out."""
        return statistics.median(self.paired())


def _over(ours: float, ref: float) -> float:
    """``ours / ref - 1`` of one repetition; a failed side is infinite: the backend's makes the
    overhead infinite, the reference's alone -1 (never NaN, never left out)."""
    if math.isinf(ours):
        return math.inf
    return ours / ref - 1.0


async def _timed(op: Op, failures: list[str], what: str, limit_s: float,
                 expect: bytes | None = None) -> float:
    """Seconds of ``op``; infinite, and a line in ``failures``, when it raised, took longer than
    ``limit_s`` or (a read) returned other bytes than ``expect``."""
    start = time.perf_counter()
    try:
        async with asyncio.timeout(limit_s):
            got = await op()
    except TimeoutError:
        failures.append(f"{what}: timed out after {limit_s:g} s")
        return math.inf
    except Exception as exc:   # counted in the figures, the run goes on
        failures.append(f"{what}: {type(exc).__name__}: {exc}")
        return math.inf
    elapsed = time.perf_counter() - start
    if expect is not None and got != expect:     # outside the clock
        failures.append(f"{what}: read back {len(got) if isinstance(got, bytes | bytearray) else '?'} "
                        f"bytes that differ from the {len(expect)} written")
        return math.inf
    return elapsed


async def run_pair(pair: Pair, reps: int, warmup: int, size: int, data: bytes,
                   limit_s: float = 600.0) -> None:
    """Each repetition writes a fresh object, reads it, and deletes it (untimed), so neither side
    pays for replacing the other's leftovers; backend and reference alternate who goes first.
    A put, get or delete that fails or times out (warm-ups too), or a get that returns other
    bytes, is counted in ``pair.failures``; its time is infinite in the figures, never left out."""
    for rep in range(warmup + reps):
        sides = ("", "ref_") if rep % 2 else ("ref_", "")
        for side in sides:
            for what in (f"{side}put", f"{side}get"):
                elapsed = await _timed(getattr(pair, what), pair.failures, what, limit_s,
                                       data if what.endswith("get") else None)
                if rep >= warmup:
                    pair.times[what].append(elapsed)
            await _timed(getattr(pair, f"{side}clean"), pair.failures, f"{side}clean", limit_s)
        figures = "warm-up, untimed" if rep < warmup else ", ".join(
            f"{w} {size / MiB / pair.times[w][-1]:.0f} MB/s" for w in ("put", "ref_put", "get", "ref_get"))
        print(f"  {pair.name} rep {rep + 1}/{warmup + reps}: {figures}", file=sys.stderr, flush=True)


# --- cases --------------------------------------------------------------------------------------


def _write_fsync(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _read(path: Path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def local_pair(data: bytes, directory: Path, opened: list[Any]) -> Pair:
    from vcasync.backends.local import LocalStorage

    storage = LocalStorage(directory / "backend")
    opened.append(storage)
    plain = directory / "plain.bin"

    async def ref_put() -> None:  # plain blocking calls, in the loop's thread: no hop, no rename
        _write_fsync(plain, data)

    async def ref_get() -> bytes:
        return _read(plain)

    async def ref_clean() -> None:
        plain.unlink()

    return Pair("local", lambda: storage.put("bench/object", data), lambda: storage.get("bench/object"),
                lambda: storage.delete("bench/object"), ref_put, ref_get, ref_clean)


async def s3_pairs(data: bytes, endpoint: str, opened: list[Any]) -> list[Pair]:
    from aiobotocore.config import AioConfig
    from aiobotocore.session import get_session
    from vcasync.backends.s3 import S3Options, S3Storage

    from vcasync.testing.emulators import DUMMY_S3_CREDENTIALS

    creds = dict(DUMMY_S3_CREDENTIALS)
    region = creds.pop("region")
    defaults = S3Options(endpoint_url=endpoint, region=region, **creds)
    ours = S3Storage(BUCKET, "backend", defaults)
    single = S3Storage(BUCKET, "single", S3Options(endpoint_url=endpoint, region=region,
                                                   multipart_threshold=len(data) + 1, **creds))
    opened += [ours, single]
    cm = get_session().create_client(
        "s3", endpoint_url=endpoint, region_name=region,
        config=AioConfig(retries={"total_max_attempts": 1}, max_pool_connections=10), **creds)
    client = await cm.__aenter__()
    opened.append(cm)
    part, width = defaults.part_size, defaults.max_concurrency

    async def direct_multipart() -> None:
        made = await client.create_multipart_upload(Bucket=BUCKET, Key="direct/multipart")
        slots = asyncio.Semaphore(width)

        async def upload(number: int, start: int) -> dict[str, Any]:
            async with slots:
                done = await client.upload_part(Bucket=BUCKET, Key="direct/multipart",
                                                UploadId=made["UploadId"], PartNumber=number,
                                                Body=data[start:start + part])
                return {"PartNumber": number, "ETag": done["ETag"]}

        parts = await asyncio.gather(*(upload(i + 1, s) for i, s in enumerate(range(0, len(data), part))))
        await client.complete_multipart_upload(Bucket=BUCKET, Key="direct/multipart",
                                               UploadId=made["UploadId"],
                                               MultipartUpload={"Parts": list(parts)})

    async def direct_get(key: str) -> bytes:
        resp = await client.get_object(Bucket=BUCKET, Key=key)
        async with resp["Body"] as body:
            out: bytes = await body.read()
            return out

    async def direct_single() -> None:
        await client.put_object(Bucket=BUCKET, Key="direct/single", Body=data)

    async def direct_delete(key: str) -> None:
        await client.delete_object(Bucket=BUCKET, Key=key)

    multipart = len(data) > defaults.multipart_threshold
    key = "direct/multipart" if multipart else "direct/single"
    pairs = [Pair("s3", lambda: ours.put("object", data), lambda: ours.get("object"),
                  lambda: ours.delete("object"), direct_multipart if multipart else direct_single,
                  lambda: direct_get(key), lambda: direct_delete(key))]
    if multipart:
        pairs.append(Pair("s3_single", lambda: single.put("object", data), lambda: single.get("object"),
                          lambda: single.delete("object"), direct_single,
                          lambda: direct_get("direct/single"), lambda: direct_delete("direct/single")))
    return pairs


async def gcs_pair(data: bytes, endpoint: str, opened: list[Any]) -> Pair:
    import aiohttp
    from gcloud.aio.storage import Storage as GcloudStorage
    from vcasync.backends.gcs import GCSOptions, GCSStorage

    ours = GCSStorage(BUCKET, "backend", GCSOptions(emulator_host=endpoint))
    session = aiohttp.ClientSession()
    direct = GcloudStorage(api_root=endpoint, session=session)  # type: ignore[arg-type]
    opened += [ours, session]

    async def ref_put() -> None:
        await direct.upload(BUCKET, "direct/object", data, content_type="application/octet-stream",
                            timeout=600)

    async def ref_get() -> bytes:
        return await direct.download(BUCKET, "direct/object", timeout=600)

    async def ref_clean() -> None:
        await direct.delete(BUCKET, "direct/object")

    return Pair("gcs", lambda: ours.put("object", data), lambda: ours.get("object"),
                lambda: ours.delete("object"), ref_put, ref_get, ref_clean)


def _create_bucket(kind: str, endpoint: str) -> None:
    if kind == "s3":
        req = urllib.request.Request(f"{endpoint}/{BUCKET}", method="PUT")
    else:
        req = urllib.request.Request(f"{endpoint}/storage/v1/b?project=bench", method="POST",
                                     data=json.dumps({"name": BUCKET}).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        resp.read()


async def _close(opened: list[Any]) -> None:
    for thing in reversed(opened):
        if hasattr(thing, "aclose"):
            await thing.aclose()
        elif hasattr(thing, "__aexit__"):
            await thing.__aexit__(None, None, None)
        else:
            await thing.close()


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    from vcasync.testing.emulators import Emulator

    size = args.size_mb * MiB
    data = os.urandom(size)
    pairs: list[Pair] = []
    opened: list[Any] = []
    servers: list[Emulator] = []
    try:
        with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
            if "local" in args.backends:
                pairs.append(local_pair(data, Path(tmp), opened))
            if "s3" in args.backends:
                servers.append(Emulator("s3", serialize=False).start())
                _create_bucket("s3", servers[-1].endpoint)
                pairs += await s3_pairs(data, servers[-1].endpoint, opened)
            if "gcs" in args.backends:
                servers.append(Emulator("gcs").start())
                _create_bucket("gcs", servers[-1].endpoint)
                pairs.append(await gcs_pair(data, servers[-1].endpoint, opened))
            for pair in pairs:
                await run_pair(pair, args.reps, args.warmup, size, data, args.timeout)
    finally:
        await _close(opened)
        for server in servers:
            server.stop()

    figures: dict[str, Any] = {}
    for pair in pairs:
        figures[f"{pair.name}_overhead"] = round(pair.overhead(), 4)
    for pair in pairs:
        figures[f"{pair.name}_overhead_paired"] = round(pair.paired_overhead(), 4)
        figures[f"{pair.name}_overhead_spread"] = spread(pair.paired(), 4)   # [min, median, max]
    for pair in pairs:
        for what in ("put", "get"):
            figures[f"{pair.name}_{what}_overhead"] = round(pair.overhead(what), 4)
            figures[f"{pair.name}_{what}_overhead_spread"] = spread(pair.paired(what), 4)
    for pair in pairs:
        for what in ("put", "get", "ref_put", "ref_get"):
            figures[f"{pair.name}_{what}_mb_s"] = round(size / MiB / pair.median(what), 1)
            figures[f"{pair.name}_{what}_mb_s_spread"] = spread(pair.mb_s(what, size), 1)
    for pair in pairs:
        figures[f"{pair.name}_failed"] = len(pair.failures)
        if pair.failures:
            print(f"FAILED {pair.name}: {len(pair.failures)}, first: {pair.failures[0]}")
    figures["failures"] = {p.name: p.failures[:5] for p in pairs if p.failures}
    figures.update(size_mb=args.size_mb, reps=args.reps, warmup=args.warmup,
                   failed=sum(len(p.failures) for p in pairs), timeout_s=args.timeout,
                   mode="fresh object per repetition, warm page cache on read; emulators in child processes")
    _table(pairs, size)
    return figures


def _table(pairs: list[Pair], size: int) -> None:
    print(f"\nput/get of {size / MiB:.0f} MB, MB/s median (min-max over repetitions); "
          "overhead = backend / direct - 1")
    print(f"{'backend':<10} {'put':>15} {'direct put':>15} {'get':>15} {'direct get':>15} "
          f"{'overhead':>9} {'paired':>8}")
    for p in pairs:
        mbs = {w: show(p.mb_s(w, size), 0) for w in ("put", "ref_put", "get", "ref_get")}
        lo, _, hi = spread(p.paired())
        print(f"{p.name:<10} {mbs['put']:>15} {mbs['ref_put']:>15} {mbs['get']:>15} "
              f"{mbs['ref_get']:>15} {p.overhead():>+9.1%} {p.paired_overhead():>+8.1%} "
              f"(min {lo:+.1%}, max {hi:+.1%})")


QUICK: dict[str, Any] = {"size_mb": 64, "reps": 3}
BACKENDS = ("local", "s3", "gcs")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.storage", description=__doc__.split("\n")[0])
    parser.add_argument("--size-mb", type=positive_int, default=400)
    parser.add_argument("--reps", type=positive_int, default=5)
    parser.add_argument("--warmup", type=non_negative_int, default=1)
    add_quick(parser, QUICK, "64 MB, 3 repetitions")
    parser.add_argument("--backends", type=one_of(BACKENDS), default="local,s3,gcs",
                        help="comma-separated: local,s3,gcs")
    parser.add_argument("--timeout", type=positive_float, default=600.0,
                        help="seconds one put, get or delete may take before it counts as failed")
    parser.add_argument("--dir", default=None, help="directory for the local case (default: tmp)")
    parser.add_argument("--json", action="store_true", help="print one JSON object last")
    return parse_args(parser, argv)


@restores_sigterm
def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    stop_on_sigterm()  # its emulators stopped, its directory removed
    args.backends = {b.strip() for b in args.backends.split(",") if b.strip()}
    figures = run_async(main_async(args))
    if args.json:
        print(json.dumps(finite(figures)))


if __name__ == "__main__":
    exit_with(main, "bench.storage")
