"""A worker's state directory: who it is, what it holds, what it has not yet delivered.

Layout (every write is write-to-temp then rename, so a SIGKILL never leaves half a file)::

    identity.json          {coordinator, run_id, worker_id, token, finished}   mode 0600: the token
                           is a credential (the dir and its subdirs are 0700); run_id (absent in
                           older dirs) says which run it is for; finished (absent: false) that its
                           coordinator said the run is finished
    lease.json             the lease being worked on (resumed after a restart if still valid)
    checkpoints/<lease>.pt the trainer's checkpoints for that lease (torch.save / weights_only load)
    results/<lease>.vca    a result payload written before upload, re-sent after a restart
    receipts.jsonl         the receipts the coordinator answered with, one JSON line each, in order
                           (the worker's own audit trail: what it was told was accepted); once it
                           holds RECEIPTS_MAX_BYTES it becomes receipts.1.jsonl (replacing the one
                           before) and a new one begins, so the two hold at most twice that
    models/v<N>.vca        downloaded model payloads (and their ETags), the newest few kept
    lock                   held (``flock``) by the live worker using the dir; it names that worker's
                           pid and host. The kernel lets go when the process dies, SIGKILL included
                           (no lock where ``fcntl`` is missing: Windows)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._paths import chmod_command, readable_by_others
from ..errors import ConfigError, FrameError, StateInUseError
from ..ledger._units import LeaseGrant, Receipt
from ..protocol import _messages as P


def _try_lock(fd: int) -> None:
    """Take the exclusive lock on ``fd`` or raise BlockingIOError (held elsewhere) at once."""
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)


try:
    import fcntl
    _TRY_LOCK: Callable[[int], None] | None = _try_lock
except ImportError:  # pragma: no cover - Windows: no lock (documented in docs/operating.md)
    _TRY_LOCK = None

__all__ = ["Identity", "StateDir"]

log = logging.getLogger("vcasync.worker")

#: How often a worker waiting for a state dir's lock tries it again.
_LOCK_POLL_S = 0.1
#: receipts.jsonl is rotated (to receipts.1.jsonl) once it holds this many bytes: about 30,000
#: receipts, so the audit trail of a long run of small units keeps the last 30,000 to 60,000 and no
#: more (until 2026-12-07 it kept every receipt: about 130 bytes a result, for good).
RECEIPTS_MAX_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Identity:
    """Who the worker is in one run. ``run_id`` is the run the token belongs to (None: saved
    before identities named their run, or by a coordinator that did not say); ``coordinator`` is
    the URL it last reached that run at, which may change (a restart on another port, a hostname
    for an address) without making it another run. ``finished``: the coordinator said that run is
    finished, so a restart that finds it unreachable is done (a supervisor that restarts every
    exit, Kubernetes, gets an exit 0 at once, not an hour of retries)."""

    coordinator: str
    worker_id: str
    token: str
    run_id: str | None = None
    finished: bool = False

    def __repr__(self) -> str:  # the token is a credential: never in a repr or a log line
        return (f"Identity(coordinator={self.coordinator!r}, worker_id={self.worker_id!r}, "
                f"run_id={self.run_id!r}, finished={self.finished!r})")

    def to_json(self) -> bytes:
        return json.dumps({"coordinator": self.coordinator, "run_id": self.run_id,
                           "worker_id": self.worker_id, "token": self.token,
                           "finished": self.finished}).encode()

    @classmethod
    def from_json(cls, raw: Any) -> Identity:
        """From the parsed ``identity.json`` (either layout); KeyError or TypeError if it is not one."""
        if not isinstance(raw, dict) or not isinstance(raw.get("run_id", ""), str | None):
            raise TypeError("not an identity record")
        run_id = raw.get("run_id")
        return cls(str(raw["coordinator"]), str(raw["worker_id"]), str(raw["token"]), run_id or None,
                   raw.get("finished") is True)


#: Directories of the state (the token in ``identity.json`` is a credential): their owner's only.
DIR_MODE = 0o700


def _atomic_write(path: Path, data: bytes, mode: int = 0o644) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        # a temporary file left by a crash keeps its mode through O_CREAT: set it, or a leftover
        # 0644 one made the next identity.json readable by every local user
        if hasattr(os, "fchmod"):      # not on Windows before 3.13
            os.fchmod(fd, mode)
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def exposed(root: Path) -> list[str]:
    """The ``chmod`` commands that would make a state dir holding a worker token (``identity.json``)
    its owner's only: none when it is (or holds no token). A dir made before 2026-12-07 was 0755,
    and an identity copied in may be 0644."""
    ident = root / "identity.json"
    if not ident.exists():
        return []       # no identity (yet): nothing secret here
    return [chmod_command(path, want) for path, want in ((root, DIR_MODE), (ident, 0o600))
            if readable_by_others(path) is not None]


class StateDir:
    """Typed access to the files above; methods are blocking (call them via ``asyncio.to_thread``
    when they may touch large files)."""

    def __init__(self, root: Path, *, lock_wait_s: float = 30.0,
                 receipts_max_bytes: int = RECEIPTS_MAX_BYTES) -> None:
        self.root = Path(root)
        #: How long :meth:`session` waits for a worker already using the dir to exit (a supervisor
        #: restart during the old one's grace period) before refusing with StateInUseError.
        self.lock_wait_s = lock_wait_s
        #: receipts.jsonl is rotated to receipts.1.jsonl once it holds this many bytes.
        self.receipts_max_bytes = receipts_max_bytes
        self._make_dirs()

    @property
    def where(self) -> str:
        """Where the state is kept, for messages: the dir (a remote state names its URL)."""
        return str(self.root)

    def _make_dirs(self) -> None:
        try:
            # the dir and its subdirs are made 0700 (the umask can only take more away); one that
            # exists keeps its mode, and holding a token it is named with the chmod to run
            self.root.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
            for sub in ("checkpoints", "results", "models"):
                (self.root / sub).mkdir(mode=DIR_MODE, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"cannot use state dir {self.root}: {exc}") from exc
        fixes = exposed(self.root)
        if fixes:
            log.warning("state dir %s holds this worker's token but other local users can read it: "
                        "run %s", self.root, " && ".join(fixes))

    @contextlib.asynccontextmanager
    async def session(self, on_lost: Callable[[], Any]) -> AsyncIterator[None]:
        """While the worker runs. A local directory needs nothing here; a remote state
        (:class:`~vcasync.worker._remote_state.RemoteStateDir`) holds its owner lease and restores."""
        async with self.locked():
            yield

    @contextlib.asynccontextmanager
    async def locked(self) -> AsyncIterator[None]:
        """Hold the dir's lock file for the block: one live worker per state dir. Two would resume
        the same lease and overwrite each other's checkpoints and spooled results. A worker still
        holding it is waited for up to ``lock_wait_s`` (it may be wrapping up after a SIGTERM), then
        refused with :class:`StateInUseError` naming it."""
        if _TRY_LOCK is None:
            yield
            return
        path = self.root / "lock"
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise ConfigError(f"cannot use state dir {self.root}: {exc}") from exc
        try:
            await self._acquire(fd, path)
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname()}).encode(), 0)
            try:
                yield
            finally:
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, 0)
        finally:
            os.close(fd)    # lets the lock go

    async def _acquire(self, fd: int, path: Path) -> None:
        assert _TRY_LOCK is not None
        deadline = time.monotonic() + self.lock_wait_s
        waiting = False
        while True:
            try:
                _TRY_LOCK(fd)
                if waiting:
                    log.info("the worker using %s has exited: going on", self.root)
                return
            except BlockingIOError:
                pass
            except OSError as exc:      # a file system without locks: say so, not a traceback
                raise ConfigError(f"cannot lock state dir {self.root} ({path}): {exc}") from exc
            holder = _lock_holder(path)
            if time.monotonic() >= deadline:
                raise StateInUseError(
                    f"the state dir {self.root} is in use by a live worker ({holder}), still after "
                    f"{self.lock_wait_s:.0f} s: give each worker its own --state-dir",
                    url=str(self.root), holder=holder)
            if not waiting:
                log.warning("the state dir %s is in use by another worker (%s): waiting up to %.0f s "
                            "for it to exit", self.root, holder, self.lock_wait_s)
                waiting = True
            await asyncio.sleep(_LOCK_POLL_S)

    # -- identity ----------------------------------------------------------------------------------
    def stored_identity(self) -> Identity | None:
        """The identity saved here, whichever run it is for (the worker decides whether it is this
        one: :meth:`vcasync.worker.Worker.run`); None when there is none."""
        try:
            return Identity.from_json(json.loads((self.root / "identity.json").read_bytes()))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def save_identity(self, ident: Identity) -> None:
        _atomic_write(self.root / "identity.json", ident.to_json(), mode=0o600)

    def forget_identity(self) -> None:
        (self.root / "identity.json").unlink(missing_ok=True)

    # -- the current lease -------------------------------------------------------------------------
    def load_lease(self) -> LeaseGrant | None:
        try:
            return P.grant_from_body(json.loads((self.root / "lease.json").read_bytes()))
        except (OSError, ValueError, FrameError):
            return None

    def save_lease(self, grant: LeaseGrant) -> None:
        _atomic_write(self.root / "lease.json", json.dumps(P.grant_to_body(grant)).encode())

    def finish_lease(self, lease_id: str) -> None:
        """Forget everything about ``lease_id``: its record, checkpoint and spooled result."""
        current = self.load_lease()
        if current is not None and current.lease_id == lease_id:
            (self.root / "lease.json").unlink(missing_ok=True)
        for path in (self.checkpoint_path(lease_id), self.result_path(lease_id)):
            path.unlink(missing_ok=True)
            # and what a write cut off by a SIGKILL left beside it (the trainer's checkpoint, a
            # spooled result: written to ".<name>.tmp", then renamed): kept until 2026-12-07
            path.with_name(f".{path.name}.tmp").unlink(missing_ok=True)

    # -- receipts ----------------------------------------------------------------------------------
    def record_receipt(self, receipt: Receipt) -> None:
        """Append ``receipt`` to ``receipts.jsonl`` and fsync it: a crash never loses a recorded line
        (one torn by a crash mid-write is ended first, so that it alone is skipped when read).
        A file that already holds ``receipts_max_bytes`` is first renamed to ``receipts.1.jsonl``
        (replacing the one before), so the trail stays within twice that however long the run."""
        line = json.dumps(P.receipt_to_body(receipt), separators=(",", ":")).encode() + b"\n"
        path = self.root / "receipts.jsonl"
        flags = os.O_RDWR | os.O_CREAT | os.O_APPEND
        fd = os.open(path, flags, 0o644)
        try:
            size = os.fstat(fd).st_size
            if size >= self.receipts_max_bytes:
                os.close(fd)
                fd = -1
                os.replace(path, self.root / "receipts.1.jsonl")
                fd = os.open(path, flags, 0o644)
            elif size and os.pread(fd, 1, size - 1) != b"\n":
                line = b"\n" + line    # a line torn by a crash: end it, or this one is lost with it
            os.write(fd, line)
            os.fsync(fd)
        finally:
            if fd >= 0:
                os.close(fd)

    def receipts(self) -> list[Receipt]:
        """The receipts recorded and still kept, oldest first: those of ``receipts.1.jsonl``, then
        of ``receipts.jsonl`` (a torn last line, cut by a crash mid-write, is skipped)."""
        lines: list[bytes] = []
        for name in ("receipts.1.jsonl", "receipts.jsonl"):
            with contextlib.suppress(FileNotFoundError):
                lines += (self.root / name).read_bytes().splitlines()
        out: list[Receipt] = []
        for line in lines:
            try:
                out.append(P.receipt_from_body(json.loads(line)))
            except (ValueError, FrameError):
                continue
        return out

    # -- checkpoints and results -------------------------------------------------------------------
    def checkpoint_path(self, lease_id: str) -> Path:
        return self.root / "checkpoints" / f"{_safe(lease_id)}.pt"

    def checkpoint_saved(self, lease_id: str) -> None:
        """The trainer just saved :meth:`checkpoint_path`; it is already where it belongs here."""

    def result_path(self, lease_id: str) -> Path:
        return self.root / "results" / f"{_safe(lease_id)}.vca"

    def pending_results(self) -> list[tuple[str, Path]]:
        """Spooled results not yet acknowledged: ``(lease_id, path)``, oldest first."""
        files = sorted((self.root / "results").glob("*.vca"), key=lambda p: p.stat().st_mtime)
        return [(p.stem, p) for p in files]

    # -- model cache -------------------------------------------------------------------------------
    def model_path(self, version: int) -> Path:
        return self.root / "models" / f"v{version}.vca"

    def load_etag(self, version: int) -> str | None:
        try:
            return (self.root / "models" / f"v{version}.etag").read_text().strip() or None
        except OSError:
            return None

    def save_etag(self, version: int, etag: str | None) -> None:
        path = self.root / "models" / f"v{version}.etag"
        if etag is None:
            path.unlink(missing_ok=True)
        else:
            _atomic_write(path, etag.encode())

    def prune_models(self, keep: Mapping[int, Any] | set[int]) -> None:
        for p in [*(self.root / "models").glob("v*.vca"), *(self.root / "models").glob("v*.etag")]:
            with contextlib.suppress(ValueError):
                if int(p.stem[1:]) not in keep:
                    p.unlink(missing_ok=True)


def _lock_holder(path: Path) -> str:
    """Who holds the lock at ``path``, as its file says ("pid P on host H"; "unknown" if unsaid)."""
    try:
        raw = json.loads(path.read_bytes())
        return f"pid {int(raw['pid'])} on host {raw['host']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "holder unknown"


def _safe(lease_id: str) -> str:
    if not lease_id or any(c in lease_id for c in "/\\\0") or lease_id.startswith("."):
        raise FrameError(f"lease id {lease_id!r} cannot name a file", field="lease_id")
    return lease_id
