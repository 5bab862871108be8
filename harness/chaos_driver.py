"""Two pieces of a chaos run that are not process management: the driver acting as a worker whose
upload is cut by a coordinator kill, and the audit of the finished run from its configuration."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import aiohttp
import torch

from vcasync._imports import import_object
from vcasync.coordinator import CoordinatorConfig
from vcasync.errors import VCAsyncError
from vcasync.ledger._units import Receipt, WorkUnit
from vcasync.policy import policy_from_config
from vcasync.protocol import _messages as P
from vcasync.runconfig import UnitsConfig, dataclass_from_table
from vcasync.storage import open_storage
from vcasync.tensors import ModelState, Update
from vcasync.trainer import TrainContext, TrainResult
from vcasync.wire import decode_payload_bytes, encode_payload
from vcasync.worker._client import CoordinatorClient, is_transient

from .audit import AuditReport, audit

if TYPE_CHECKING:
    from .chaos import ChaosConfig

__all__ = ["DriverWorker", "audit_run", "one_torch_thread", "reference_accuracy"]


@contextlib.contextmanager
def one_torch_thread() -> Iterator[None]:
    """torch on one thread for the duration: next to a fleet of processes on a few cores, torch's
    own thread pool oversubscribes them (measured here: a unit 20x slower)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


#: Seconds between two tries of a slow upload, unless a 503 asked for less (its ``retry_after``).
RETRY_S = 1.0


class DriverWorker:
    """One more worker, run by the chaos driver: it trains a real unit, sends half its result, and
    after the coordinator was killed mid-upload, delivers it again the way a worker would.

    The prepared result belongs to the slow upload until a kill cut that upload
    (:meth:`upload_cut`); only then does :meth:`finish_upload` deliver it whole. Delivered before
    (the run's delivery task polls every half second), a result prepared for the kill was merged
    instead: the slow upload that followed was answered at once (a duplicate receipt, or the 503
    of an outage the whole upload met), and every try after a refusal had to lease and train a new
    unit, which under load took as long as the rest of the run.
    """

    def __init__(self, url: str, secret: str, state: Path, cfg: ChaosConfig) -> None:
        self.url, self.secret, self.state, self.cfg = url, secret, Path(state), cfg
        self.state.mkdir(parents=True, exist_ok=True)
        self.client = CoordinatorClient(url, timeout_s=30.0)
        self.receipts: list[Receipt] = []
        self._joined = False
        self._pending: tuple[str, bytes] | None = None
        self._cut = False          # the pending result's upload was cut by a kill: deliver it
        self.retry_in = RETRY_S    # how long to wait before the next slow upload
        self._writer: asyncio.StreamWriter | None = None
        self.last_error = ""
        self._beats: asyncio.Task[None] | None = None

    async def aclose(self) -> None:
        self.abandon_upload()
        await self._stop_heartbeats()
        await self.client.aclose()

    async def warm_up(self) -> None:
        """Run the trainer once on a throwaway one-step unit, so that the first real result (wanted
        at a precise moment) does not wait for imports and data loading."""
        trainer = import_object(self.cfg.trainer, what="trainer")
        torch.manual_seed(self.cfg.seed)
        model = ModelState.from_module(import_object(self.cfg.model, what="model factory")())
        unit = WorkUnit("warm-up", steps=1)
        ctx = TrainContext(unit=unit, lease_id="warm-up", base_version=0, model=model,
                           checkpoint_path=self.state / "warm-up.pt", resumed=False,
                           stop=threading.Event())
        await asyncio.to_thread(trainer, ctx)

    async def prepare(self) -> bool:
        """Lease a unit and train it; the lease is heartbeated until the result is delivered.
        False when that failed (the coordinator down, no work left): try again later."""
        if self._pending is not None:
            return True
        try:
            if not self._joined:
                await self.client.join(self.secret, "chaos-driver")
                self._joined = True
            grant = await self.client.lease()
            path = self.state / f"v{grant.base_version}.vca"
            await self.client.download_model(grant.base_version, path)
        except (VCAsyncError, OSError, TimeoutError, aiohttp.ClientError) as exc:
            self.last_error = repr(exc)[:200]
            return False
        p = decode_payload_bytes(await asyncio.to_thread(path.read_bytes), expected_kind="model")
        base = ModelState(p.tensors, grant.base_version)
        trainer = import_object(self.cfg.trainer, what="trainer")
        ctx = TrainContext(unit=grant.unit, lease_id=grant.lease_id, base_version=grant.base_version,
                           model=base.clone(), checkpoint_path=self.state / "ckpt.pt", resumed=False,
                           stop=threading.Event())
        self._beats = asyncio.create_task(self._heartbeats(grant.lease_id, ctx, grant.heartbeat_interval_s))
        out: TrainResult = await asyncio.to_thread(trainer, ctx)
        delta = {k: (out.tensors[k].to(v.dtype) - v).contiguous() for k, v in base.items()}
        meta = {"lease_id": grant.lease_id, "base_version": grant.base_version, "kind": "delta",
                "samples": int(out.samples), "steps": int(out.steps), "partial": False,
                "metrics": {k: float(v) for k, v in out.metrics.items()}}
        data = await asyncio.to_thread(lambda: b"".join(encode_payload("result", meta, delta)))
        self._pending, self._cut = (grant.lease_id, data), False
        return True

    async def _heartbeats(self, lease_id: str, ctx: TrainContext, interval: float) -> None:
        while True:
            await asyncio.sleep(max(0.1, interval))
            with contextlib.suppress(VCAsyncError, OSError, TimeoutError, aiohttp.ClientError):
                await self.client.heartbeat(lease_id, ctx.steps_done)

    async def _stop_heartbeats(self) -> None:
        beats, self._beats = self._beats, None
        if beats is not None:
            beats.cancel()
            await asyncio.gather(beats, return_exceptions=True)

    async def start_slow_upload(self) -> int | None:
        """Send half of the prepared result (preparing it first if needed); the bytes sent, or None
        when the coordinator is not reading that upload now."""
        self.last_error, self.retry_in = "", RETRY_S
        if not await self.prepare():
            return None
        assert self._pending is not None
        lease_id, data = self._pending
        url = urlsplit(self.url)
        try:
            reader, writer = await asyncio.open_connection(url.hostname, url.port)
        except OSError as exc:
            self.last_error = repr(exc)[:200]
            return None      # the coordinator went away meanwhile; the result is delivered later
        head = (f"PUT {P.API_PREFIX}/leases/{lease_id}/result HTTP/1.1\r\nHost: {url.netloc}\r\n"
                f"Authorization: Bearer {self.client.token}\r\nContent-Type: {P.PAYLOAD}\r\n"
                f"Content-Length: {len(data)}\r\n\r\n").encode()
        half = len(data) // 2
        writer.write(head + data[:half])
        await writer.drain()
        await asyncio.sleep(0.3)       # the coordinator is now reading the body, waiting for more
        self._writer = writer
        try:   # an answer already (an error) means the coordinator is not mid-upload any more
            answered = await asyncio.wait_for(reader.read(1), 0.05)
        except TimeoutError:
            return half
        answered += await _rest_of_answer(reader)
        # Answered at once. A 503 (the coordinator's storage failed, injected faults included)
        # took nothing in: the same result is sent again next time, as soon as the answer's
        # retry_after allows. Anything else refused it, e.g. because its unit was done by another
        # worker meanwhile (its lease expired: heartbeats without progress do not extend it);
        # re-sent, it would be refused the same way until the run ends, with the kill never made:
        # drop it, and prepare a new one.
        self.last_error = f"answered before the kill: {_describe_answer(answered)}"
        self.abandon_upload()
        if _status(answered) == 503:
            self.retry_in = _retry_after(answered, RETRY_S)
        else:
            self._pending = None
            await self._stop_heartbeats()
        return None

    def abandon_upload(self) -> None:
        """Close the slow upload's connection; its result stays for the next try."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def upload_cut(self) -> None:
        """The coordinator was killed while the slow upload was half sent: its result is now
        :meth:`finish_upload`'s to deliver, as a worker would after the restart."""
        self.abandon_upload()
        if self._pending is not None:
            self._cut = True

    async def finish_upload(self) -> None:
        """Re-send the cut result once the coordinator is back (a no-op unless a kill cut it)."""
        if self._pending is None or not self._cut:
            return
        lease_id, data = self._pending
        try:
            receipt = await self.client.submit(lease_id, data)
        except Exception as exc:
            if is_transient(exc):
                return
            self.last_error = repr(exc)[:200]
        else:
            self.receipts.append(receipt)
        self._pending = None
        await self._stop_heartbeats()


async def _rest_of_answer(reader: asyncio.StreamReader, timeout_s: float = 2.0) -> bytes:
    """The rest of an HTTP answer whose first byte was read: to the end of its body (its
    ``Content-Length``), the connection's end, or ``timeout_s``, whichever comes first."""
    out = b""
    with contextlib.suppress(TimeoutError, OSError):
        async with asyncio.timeout(timeout_s):
            while True:
                head, sep, body = out.partition(b"\r\n\r\n")
                length = _content_length(head) if sep else None
                if length is not None and len(body) >= length:
                    break
                chunk = await reader.read(65536)
                if not chunk:
                    break
                out += chunk
    return out


def _content_length(head: bytes) -> int | None:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length" and value.strip().isdigit():
            return int(value.strip())
    return None


def _describe_answer(answer: bytes) -> str:
    """An HTTP answer in one line for the run's notes: the status line, and for a JSON error body
    its ``error`` code, ``message`` and ``retry_after`` in full (the notes say why a kill waited);
    any other body, its first bytes."""
    head, _, body = answer.partition(b"\r\n\r\n")
    status = head.split(b"\r\n", 1)[0].decode("latin-1", "replace")
    headers = head.decode("latin-1", "replace").lower()
    try:
        doc = json.loads(body) if "application/json" in headers else None
    except ValueError:
        doc = None
    if not isinstance(doc, dict) or "error" not in doc:     # not an error (a receipt: a duplicate)
        return f"{status}: {body[:300]!r}"
    wait = f" (retry_after {doc['retry_after']})" if "retry_after" in doc else ""
    return f"{status}: {doc.get('error')}{wait}: {doc.get('message')}"


def _retry_after(answer: bytes, longest: float) -> float:
    """The ``retry_after`` of a JSON error answer (the Retry-After header rounds it to whole
    seconds), at most ``longest``; ``longest`` when it has none."""
    _, _, body = answer.partition(b"\r\n\r\n")
    try:
        doc = json.loads(body)
    except ValueError:
        return longest
    wait = doc.get("retry_after") if isinstance(doc, dict) else None
    if isinstance(wait, int | float) and wait >= 0:
        return min(max(float(wait), 0.05), longest)
    return longest


def _status(answer: bytes) -> int | None:
    """The status code of an HTTP response's first bytes, or None when they hold none."""
    parts = answer.split(b" ", 2)
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None


async def audit_run(cfg: ChaosConfig, store_url: str, receipts: Mapping[str, Sequence[Receipt]],
                    observed: Sequence[int]) -> AuditReport:
    """Audit the storage of a run made with ``cfg`` (the same model, units, policy and settings)."""
    table = cfg.run_table(store_url, Path("unused"))
    torch.manual_seed(cfg.seed)
    module = import_object(cfg.model, what="model factory")()
    model = ModelState.from_module(module)
    units = dataclass_from_table(UnitsConfig, table["units"], "units").build()
    policy = policy_from_config({"policy": dict(cfg.policy)})
    config = dataclass_from_table(CoordinatorConfig, table["coordinator"], "coordinator")
    evaluate: Any = None
    with contextlib.suppress(VCAsyncError):
        evaluate = import_object(cfg.model.rsplit(":", 1)[0] + ":evaluate", what="evaluate")
    one_per_merge = str(cfg.policy.get("name", "vcasgd")) not in ("fedbuff", "sync")
    async with open_storage(store_url) as storage:
        return await audit(storage, model=model, units=units, policy=policy, config=config,
                           receipts=receipts, observed_versions=observed, evaluate=evaluate,
                           one_version_per_merge=one_per_merge)


def reference_accuracy(cfg: ChaosConfig, work_dir: Path) -> float:
    """The accuracy of the same units merged by the same policy with no fleet at all: trained one
    after the other in this process, each from the newest model (no staleness, nothing lost). The
    cheap undisturbed reference for tests; ``bench.chaos`` also runs the undisturbed fleet."""
    with one_torch_thread():
        return _reference(cfg, work_dir)


def _reference(cfg: ChaosConfig, work_dir: Path) -> float:
    torch.manual_seed(cfg.seed)
    model = ModelState.from_module(import_object(cfg.model, what="model factory")())
    table = cfg.run_table("memory://reference", Path("unused"))
    units = dataclass_from_table(UnitsConfig, table["units"], "units").build()
    policy = policy_from_config({"policy": dict(cfg.policy)})
    trainer = import_object(cfg.trainer, what="trainer")
    evaluate = import_object(cfg.model.rsplit(":", 1)[0] + ":evaluate", what="evaluate")
    state = policy.init_state(model)
    work_dir.mkdir(parents=True, exist_ok=True)
    for i, unit in enumerate(units):
        ctx = TrainContext(unit=unit, lease_id=f"reference-{i}", base_version=model.version,
                           model=model.clone(), checkpoint_path=work_dir / f"reference-{i}.pt",
                           resumed=False, stop=threading.Event())
        out: TrainResult = trainer(ctx)
        delta = {k: (out.tensors[k].to(v.dtype) - v).contiguous() for k, v in model.items()}
        update = Update(tensors=delta, kind="delta", base_version=model.version, staleness=0,
                        samples=int(out.samples), steps=int(out.steps), worker_id="reference",
                        unit_id=unit.unit_id, base=model.clone() if policy.needs_base else None)
        merged = policy.merge(model, update, state)
        if merged is not None:
            model = ModelState(dict(merged.tensors), model.version + 1)
    return float(evaluate(model))
