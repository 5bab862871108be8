"""Server-side processes for the HTTP benchmarks (``python -m bench._peers MODE ...``).

* ``coordinator``: a real Coordinator behind the real vcasync server, plus ``GET /bench/stall`` that
  reports (and resets) the event loop's lateness measured by a 1 ms ticker in the same process;
  ``GET /bench/rss`` the process's resident memory and its peak (``?reset=1``: the peak is then
  reset to the current resident set, through ``/proc/self/clear_refs``, so the next read's peak is
  that of what happened in between; ``"reset": false`` where the kernel does not allow it),
  ``GET /bench/merged?version=N`` answers once the coordinator serves version N.
* ``post``: a bare aiohttp server whose ``POST /sink`` streams the body in and discards it.
* ``durable``: the same, but it writes the body to a new file as it arrives (on the disk the
  coordinator's ``file://`` storage uses) and fsyncs it before answering: the least any server must
  do before it may acknowledge an upload durably. It starts the disk's writeback every
  ``WRITEBACK_BYTES`` as it goes, as the coordinator's storage does (so the floor is not one the
  coordinator beats by a trick the reference lacks); ``durable-plain`` writes without that advice.
* ``tcp``: a bare asyncio TCP server: 8-byte length, that many bytes, one byte back.
* ``bare``: a bare aiohttp server whose every ``POST`` reads its small body and answers a small
  msgpack reply, plus ``GET /bench/rss``: the reference a control request is measured against.

``--tls-cert``/``--tls-key`` serve HTTPS (``coordinator`` and ``bare``).

Each writes its URL (or ``host:port``) to ``--port-file`` once it listens, then serves until SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import gc
import math
import os
import resource
import signal
import tempfile
import time
from pathlib import Path
from typing import Any, cast

import msgpack
import torch
from aiohttp import web

from backends.local import Writeback  # the storage's own early writeback
from harness.fleet import process_memory
from vcasync._loop import run
from vcasync.coordinator import Coordinator, CoordinatorConfig
from vcasync.ledger._units import WorkUnit
from vcasync.policy import build_policy
from vcasync.server import CollectorGuard, build_app
from vcasync.server._auth import TokenAuthority
from vcasync.storage import open_storage
from vcasync.tensors import ModelState

SECRET = "bench-join-secret-0123456789"


#: ResNet-50's parameter count at scale 1 (float tensors; its 53 counters come on top).
RESNET50_PARAMS = 25_557_032
ARCHS = ("flat", "resnet50")


def bench_model(params: int, tensors: int = 4, arch: str = "flat") -> ModelState:
    """``params`` float32 parameters: ``flat``, in ``tensors`` equal 1-D tensors; ``resnet50``, in
    a ResNet-50 state dict's 320 tensors (channels scaled to reach about ``params``; int64
    ``num_batches_tracked`` counters included), trained-like values."""
    if arch == "resnet50":
        from .codec import resnet50_shapes, trained_like
        shapes = resnet50_shapes(math.sqrt(params / RESNET50_PARAMS))
        return ModelState(trained_like(shapes))
    if arch != "flat":
        raise ValueError(f"unknown bench model {arch!r}; use one of {ARCHS}")
    per = max(1, params // tensors)
    gen = torch.Generator().manual_seed(0)
    return ModelState({f"layer{i}.weight": torch.randn(per, generator=gen) for i in range(tensors)})


def bench_delta(model: ModelState, seed: int = 1, scale: float = 1e-3) -> dict[str, torch.Tensor]:
    """A small random delta for ``model``: floats ~N(0, scale), counters +1."""
    gen = torch.Generator().manual_seed(seed)
    return {k: (torch.randn(v.shape, generator=gen) * scale).to(v.dtype) if v.is_floating_point()
            else torch.ones_like(v) for k, v in model.items()}


class GcPauses:
    """Durations of the collector's passes in this process, by generation (gc.callbacks)."""

    def __init__(self) -> None:
        self.pauses: list[tuple[int, float]] = []
        self._t0 = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.pauses.append((info["generation"], (time.perf_counter() - self._t0) * 1000.0))

    def reset(self) -> None:
        self.pauses.clear()

    def summary(self) -> dict[str, float]:
        gen2 = [ms for g, ms in self.pauses if g == 2]
        return {"gc_passes": len(self.pauses), "gc_gen2_passes": len(gen2),
                "gc_max_ms": max((ms for _, ms in self.pauses), default=0.0)}


class StallMonitor:
    """Lateness of a 1 ms sleep, sampled continuously: how long the loop was blocked."""

    def __init__(self) -> None:
        self.samples: list[float] = []

    async def run(self) -> None:
        while True:  # perf_counter, not loop.time(): uvloop's clock ticks in whole milliseconds
            t0 = time.perf_counter()
            await asyncio.sleep(0.001)
            self.samples.append(max(0.0, time.perf_counter() - t0 - 0.001) * 1000.0)

    def take(self) -> list[float]:
        """The samples since the last call (milliseconds late), and start afresh."""
        s, self.samples = self.samples, []
        return s


async def _serve(app: web.Application, port_file: Path, stop: asyncio.Event, *, access_log: bool,
                 tls: tuple[Path, Path] | None = None) -> None:
    runner = web.AppRunner(app, handle_signals=False, **({} if access_log else {"access_log": None}))
    await runner.setup()
    ctx = None
    if tls is not None:
        from ._tls import server_context
        ctx = server_context(*tls)
    site = web.TCPSite(runner, "127.0.0.1", 0, backlog=4096, ssl_context=ctx)
    await site.start()
    port = runner.addresses[0][1]
    scheme = "https" if ctx else "http"
    await asyncio.to_thread(port_file.write_text, f"{scheme}://127.0.0.1:{port}\n")
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


async def coordinator(a: argparse.Namespace, stop: asyncio.Event) -> None:
    units = [WorkUnit(f"u{i}", steps=a.steps) for i in range(a.units)]
    monitor = StallMonitor()
    pauses = GcPauses()
    # --store-dir: a directory the caller made and removes (it outlives this process if this
    # process is killed before its own clean-up); without it, a temporary one of this process
    with (contextlib.nullcontext(str(a.store_dir)) if a.store_dir is not None
          else tempfile.TemporaryDirectory(prefix="vcasync-bench-")) as tmp:
        url = f"file://{tmp}/store" if a.durability != "none" else "memory://bench"
        cfg = CoordinatorConfig(durability=a.durability, lease_timeout_s=a.lease_timeout,
                                **({} if a.max_staleness is None else {"max_staleness": a.max_staleness}))
        policy = build_policy("vcasgd")
        async with open_storage(url) as storage, \
                Coordinator(bench_model(a.params, arch=a.arch), units, policy=policy, storage=storage,
                            config=cfg, adopt_model=True) as coord:
            # the model is built in the call, not kept here, and handed over, as `vcasync
            # coordinator` does (a copy kept here is not the coordinator's memory, yet it would
            # count in this process's RSS)
            app = build_app(coord, TokenAuthority(join_secret=SECRET))

            async def stall(request: web.Request) -> web.Response:
                return web.json_response({"samples": monitor.take()})

            async def rss(request: web.Request) -> web.Response:
                cpu = os.times()
                mem = process_memory(os.getpid())
                reset = bool(request.query.get("reset")) and _reset_peak()
                return web.json_response({"rss": mem.get("rss", 0), "rss_peak": mem.get("peak", 0),
                                          "version": coord.version, "reset": reset,
                                          "cpu_s": cpu.user + cpu.system, **pauses.summary()})

            async def merged(request: web.Request) -> web.Response:
                # Waits here, polling a field every 0.5 ms, instead of the client asking over
                # HTTP in a loop: those requests competed with the merge for the loop and CPU.
                want = int(request.query["version"])
                deadline = time.monotonic() + float(request.query.get("timeout", "600"))
                while coord.version < want and time.monotonic() < deadline:  # noqa: ASYNC110 (no version event to await)
                    await asyncio.sleep(0.0005)
                return web.json_response({"version": coord.version})

            app.router.add_get("/bench/stall", stall)
            app.router.add_get("/bench/rss", rss)
            app.router.add_get("/bench/merged", merged)
            # As `vcasync coordinator` does once it is up; --no-gc-guard: only the start-up freeze.
            guard = CollectorGuard() if a.gc_guard else contextlib.nullcontext()
            if not a.gc_guard:
                gc.freeze()
            async with guard, asyncio.TaskGroup() as tg:
                pauses.reset()   # the start-up collection is not a pause anyone waits on
                ticker = tg.create_task(monitor.run() if a.stall_monitor else asyncio.sleep(0))
                try:
                    await _serve(app, a.port_file, stop, access_log=False, tls=_tls(a))
                finally:
                    ticker.cancel()


def _tls(a: argparse.Namespace) -> tuple[Path, Path] | None:
    return (a.tls_cert, a.tls_key) if a.tls_cert else None


def _reset_peak() -> bool:
    """Reset this process's peak resident set (``VmHWM``) to its current one; False where the
    kernel does not allow it (not Linux, or ``clear_refs`` not writable)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


def _usage() -> dict[str, float]:
    cpu = os.times()
    return {"rss": process_memory(os.getpid()).get("rss", 0), "cpu_s": cpu.user + cpu.system}


async def bare(a: argparse.Namespace, stop: asyncio.Event) -> None:
    """The least an aiohttp server does per control request: read the body, answer a few bytes."""
    reply = msgpack.packb({"ok": True, "lease_id": "x" * 22, "deadline": 1.0})

    async def handle(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=reply, content_type="application/msgpack")

    async def usage(request: web.Request) -> web.Response:
        return web.json_response(_usage())

    app = web.Application(client_max_size=1 << 16)
    app.router.add_get("/bench/rss", usage)
    app.router.add_post("/{tail:.*}", handle)
    async with CollectorGuard():   # the same collector settings as the coordinator's peer
        await _serve(app, a.port_file, stop, access_log=False, tls=_tls(a))


async def post_sink(a: argparse.Namespace, stop: asyncio.Event) -> None:
    async def sink(request: web.Request) -> web.Response:
        n = 0
        async for chunk in request.content.iter_chunked(1 << 20):
            n += len(chunk)
        return web.json_response({"bytes": n})

    app = web.Application(client_max_size=1 << 16)
    app.router.add_post("/sink", sink)
    await _serve(app, a.port_file, stop, access_log=False)


async def durable_sink(a: argparse.Namespace, stop: asyncio.Event, *, writeback: bool = True) -> None:
    with tempfile.TemporaryDirectory(prefix="vcasync-bench-durable-") as tmp:
        count = 0

        async def sink(request: web.Request) -> web.Response:
            nonlocal count
            count += 1
            n = 0
            # Plain blocking writes on the loop: one client at a time, the cheapest correct path.
            fd = os.open(Path(tmp) / f"{count:08d}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            early = Writeback(fd) if writeback else None
            try:
                async for chunk in request.content.iter_chunked(1 << 20):
                    view = memoryview(chunk)
                    while view:
                        view = view[os.write(fd, view):]
                    n += len(chunk)
                    if early is not None:
                        early.wrote(len(chunk))
                os.fsync(fd)
            finally:
                os.close(fd)
            return web.json_response({"bytes": n})

        app = web.Application(client_max_size=1 << 16)
        app.router.add_post("/sink", sink)
        await _serve(app, a.port_file, stop, access_log=False)


class _Sink(asyncio.Protocol):
    """8-byte little-endian length, then that many bytes (counted, never copied), then b"k" back."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.head = b""
        self.left = -1

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not an asyncio.Transport subclass

    def data_received(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            if self.left < 0:
                need = 8 - len(self.head)
                self.head += bytes(view[:need])
                view = view[need:]
                if len(self.head) == 8:
                    self.left = int.from_bytes(self.head, "little")
                    self.head = b""
                continue
            take = min(self.left, len(view))
            self.left -= take
            view = view[take:]
            if self.left == 0:
                self.left = -1
                assert self.transport is not None
                self.transport.write(b"k")


async def tcp_sink(a: argparse.Namespace, stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(_Sink, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    a.port_file.write_text(f"127.0.0.1:{port}\n")
    async with server:
        await stop.wait()


MODES: dict[str, Any] = {"coordinator": coordinator, "post": post_sink, "durable": durable_sink,
                         "durable-plain": functools.partial(durable_sink, writeback=False),
                         "tcp": tcp_sink, "bare": bare}


async def main(a: argparse.Namespace) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await MODES[a.mode](a, stop)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=sorted(MODES))
    p.add_argument("--port-file", type=Path, required=True)
    p.add_argument("--params", type=int, default=1000)
    p.add_argument("--arch", default="flat", choices=ARCHS)
    p.add_argument("--units", type=int, default=100)
    p.add_argument("--steps", type=int, default=1)
    p.add_argument("--durability", default="none", choices=["none", "snapshot", "journal"])
    p.add_argument("--lease-timeout", type=float, default=600.0)
    p.add_argument("--max-staleness", type=int, default=None, help="default: CoordinatorConfig's")
    p.add_argument("--store-dir", type=Path, default=None,
                   help="coordinator: keep its file:// store under this directory (the caller's to "
                        "remove) instead of a temporary one of this process")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--tls-cert", type=Path, default=None)
    p.add_argument("--tls-key", type=Path, default=None)
    p.add_argument("--no-gc-guard", dest="gc_guard", action="store_false",
                   help="freeze the collector once at start-up only (the coordinator before "
                        "CollectorGuard), to measure what the guard changes")
    p.add_argument("--stall-monitor", action="store_true", help="sample the loop's lateness every 1 ms")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:   # a fleet of 10,000 connections needs more than the usual 1,024
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    run(main(args))
