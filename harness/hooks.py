"""Chaos hooks for a coordinator process: pause points, and injected storage faults.

**Pause points** are named moments at which a chaos test can SIGKILL a coordinator, deterministically.

A crash "in the middle of a merge" or "in the middle of a snapshot write" happens by chance only
once in many runs when merges and snapshots take milliseconds. A :class:`PausePlan` makes those
moments reachable: at the ``n``-th time the coordinator process reaches a point, it writes a marker
file ``<marker_dir>/<point>.<pid>`` and then holds still for ``pause_s`` seconds. The test waits for
the marker and kills the process while it is provably inside that step.

Points:

``merge``     inside the merge policy (a worker thread), after the result was journaled and before
              the new version is published or the result acknowledged;
``snapshot``  after one data object of a snapshot was written under ``<prefix>/snapshots/`` and
              before its manifest (a half-written checkpoint is on the storage);
``journal``   after a journal entry was written under ``<prefix>/journal/`` (durable, not yet merged).

**Storage faults** (``VCASYNC_STORAGE_FAULTS``) wrap the coordinator's storage in
:class:`vcasync.testing.faults.FaultyStorage` layers, e.g. ``"fail=0.03,lose_reply=0.01,
ops=put+put_stream+delete;delay=0.2,max_delay_s=0.1"``: writes fail (before or after they happen),
and a fifth of all calls are slowed by up to 100 ms. Layers are separated by ``;``.

Nothing here runs in production: this module is not even installed (it lives in the repository's
``harness/``, outside the wheel), and only the test-only entry point ``python -m
harness.chaos_coordinator`` (:mod:`harness.chaos_coordinator`) builds :class:`ChaosHooks` from the
environment (``VCASYNC_PAUSE_AT="merge@3"``, ``VCASYNC_PAUSE_DIR``,
``VCASYNC_PAUSE_S``, ``VCASYNC_STORAGE_FAULTS``) and wraps the coordinator's policy and storage. The
``vcasync coordinator`` command never reads these variables, so a normal run has no extra call on
any path and no forgotten variable can pause it or fail its writes.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections import Counter
from collections.abc import AsyncIterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Final

from vcasync.errors import ConfigError
from vcasync.policy import MergePolicy, PolicyState
from vcasync.storage import BytesLike, Storage
from vcasync.tensors import ModelState, Update
from vcasync.testing.faults import ForwardingStorage

__all__ = ["POINTS", "ChaosHooks", "PausePlan", "PausePoints", "PausingStorage", "fault_layers"]

POINTS: Final = frozenset({"merge", "snapshot", "journal"})
ENV_AT: Final = "VCASYNC_PAUSE_AT"
ENV_DIR: Final = "VCASYNC_PAUSE_DIR"
ENV_SECONDS: Final = "VCASYNC_PAUSE_S"
ENV_FAULTS: Final = "VCASYNC_STORAGE_FAULTS"


@dataclass(frozen=True, slots=True)
class PausePlan:
    """Which points pause, at which occurrence (1-based), where markers go and for how long."""

    at: Mapping[str, int]
    marker_dir: Path
    pause_s: float = 120.0
    points: frozenset[str] = field(default=POINTS)

    def __post_init__(self) -> None:
        unknown = sorted(set(self.at) - self.points)
        if unknown:
            raise ConfigError(f"unknown pause points {unknown}; known: {sorted(self.points)}")
        bad = {k: v for k, v in self.at.items() if isinstance(v, bool) or not isinstance(v, int) or v < 1}
        if bad:
            raise ConfigError(f"pause occurrences must be ints >= 1, got {bad}")
        if not self.pause_s > 0:
            raise ConfigError(f"pause_s must be > 0, got {self.pause_s}")

    @classmethod
    def parse(cls, spec: str, marker_dir: str | Path, pause_s: float = 120.0) -> PausePlan:
        """``"merge@3,snapshot"``: pause at the 3rd merge and the 1st snapshot write."""
        at: dict[str, int] = {}
        for item in filter(None, (s.strip() for s in spec.split(","))):
            point, _, n = item.partition("@")
            try:
                at[point] = int(n) if n else 1
            except ValueError:
                raise ConfigError(f"pause spec {item!r} must look like point or point@N") from None
        return cls(at, Path(marker_dir), pause_s)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> PausePlan | None:
        """The plan ``VCASYNC_PAUSE_AT`` describes, or None when it is unset (the normal case)."""
        spec = env.get(ENV_AT, "").strip()
        if not spec:
            return None
        marker_dir = env.get(ENV_DIR)
        if not marker_dir:
            raise ConfigError(f"{ENV_AT} is set but {ENV_DIR} (where markers go) is not")
        try:
            seconds = float(env.get(ENV_SECONDS, "120"))
        except ValueError:
            raise ConfigError(f"{ENV_SECONDS} must be a number of seconds") from None
        return cls.parse(spec, marker_dir, seconds)

    def env(self) -> dict[str, str]:
        """The environment variables that carry this plan to a ``vcasync coordinator`` process."""
        return {ENV_AT: ",".join(f"{k}@{v}" for k, v in self.at.items()),
                ENV_DIR: str(self.marker_dir), ENV_SECONDS: repr(self.pause_s)}


def marker_path(marker_dir: Path, point: str, pid: int) -> Path:
    """Where the process ``pid`` announces that it is paused at ``point``."""
    return marker_dir / f"{point}.{pid}"


class PausePoints:
    """Counts arrivals at each point and pauses at the planned one."""

    def __init__(self, plan: PausePlan) -> None:
        self.plan = plan
        self._seen: Counter[str] = Counter()

    def _arrive(self, point: str) -> bool:
        self._seen[point] += 1
        if self._seen[point] != self.plan.at.get(point):
            return False
        path = marker_path(self.plan.marker_dir, point, os.getpid())
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps({"point": point, "pid": os.getpid(), "n": self._seen[point],
                                   "time": time.time()}))
        os.replace(tmp, path)
        return True

    def pause_sync(self, point: str) -> None:
        """From a worker thread: block here if this arrival is the planned one."""
        if self._arrive(point):
            time.sleep(self.plan.pause_s)

    async def pause(self, point: str) -> None:
        """From the event loop: wait here (the loop keeps serving) if this is the planned arrival."""
        if self._arrive(point):
            await asyncio.sleep(self.plan.pause_s)

    def wrap_policy(self, policy: MergePolicy) -> MergePolicy:
        """``policy`` with the ``merge`` point inside its ``merge`` (same name, base needs, claims)."""
        cls = type(f"Pausing{type(policy).__name__}", (_PausingPolicy,), {"name": policy.name})
        wrapped: MergePolicy = cls(policy, self)
        return wrapped

    def wrap_storage(self, storage: Storage, state_prefix: str) -> PausingStorage:
        return PausingStorage(storage, self, state_prefix)


class _PausingPolicy:
    name: ClassVar[str] = "pausing"

    def __init__(self, inner: MergePolicy, points: PausePoints) -> None:
        self.inner = inner
        self._points = points

    @property
    def needs_base(self) -> bool:
        return self.inner.needs_base

    @property
    def claims(self) -> frozenset[str]:
        return self.inner.claims

    def init_state(self, model: ModelState) -> PolicyState:
        return self.inner.init_state(model)

    def merge(self, model: ModelState, update: Update, state: PolicyState) -> ModelState | None:
        self._points.pause_sync("merge")
        return self.inner.merge(model, update, state)


class PausingStorage(ForwardingStorage):
    """A storage that pauses after writes of snapshot data objects and journal entries."""

    def __init__(self, inner: Storage, points: PausePoints, state_prefix: str) -> None:
        super().__init__(inner)
        self._points = points
        prefix = state_prefix.strip("/")
        self._where = ((f"{prefix}/snapshots/", "snapshot"), (f"{prefix}/journal/", "journal"))

    async def _after_write(self, key: str) -> None:
        for prefix, point in self._where:
            # A snapshot's manifest is written last: pausing after a data object leaves a
            # checkpoint half written, the interesting moment to die.
            if key.startswith(prefix) and "/manifests/" not in key:
                await self._points.pause(point)

    async def put(self, key: str, data: BytesLike, *, if_absent: bool = False) -> None:
        await self.inner.put(key, data, if_absent=if_absent)
        await self._after_write(key)

    async def put_stream(self, key: str, chunks: AsyncIterable[BytesLike], *,
                         if_absent: bool = False) -> None:
        await self.inner.put_stream(key, chunks, if_absent=if_absent)
        await self._after_write(key)


def fault_layers(spec: str) -> list[dict[str, Any]]:
    """Parse ``VCASYNC_STORAGE_FAULTS`` into keyword arguments for ``FaultPlan`` (plus ``seed``)."""
    layers: list[dict[str, Any]] = []
    for layer in filter(None, (x.strip() for x in spec.split(";"))):
        kwargs: dict[str, Any] = {}
        for item in filter(None, (x.strip() for x in layer.split(","))):
            key, sep, value = item.partition("=")
            if not sep:
                raise ConfigError(f"storage fault {item!r} must look like name=value")
            try:
                if key == "ops":
                    kwargs[key] = frozenset(value.split("+"))
                elif key == "seed":
                    kwargs[key] = int(value)
                else:
                    kwargs[key] = float(value)
            except ValueError:
                raise ConfigError(f"storage fault {item!r}: {value!r} is not a number") from None
        layers.append(kwargs)
    return layers


class ChaosHooks:
    """What a chaos test asked the coordinator process for: pause points and storage faults."""

    def __init__(self, pauses: PausePoints | None, faults: list[dict[str, Any]]) -> None:
        self.pauses = pauses
        self.faults = faults

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> ChaosHooks | None:
        """None (the normal case) unless a ``VCASYNC_PAUSE_*`` or ``VCASYNC_STORAGE_FAULTS`` is set."""
        plan = PausePlan.from_env(env)
        faults = fault_layers(env.get(ENV_FAULTS, ""))
        if plan is None and not faults:
            return None
        return cls(PausePoints(plan) if plan is not None else None, faults)

    def wrap_policy(self, policy: MergePolicy) -> MergePolicy:
        return self.pauses.wrap_policy(policy) if self.pauses is not None else policy

    def wrap_storage(self, storage: Storage, state_prefix: str) -> Storage:
        """Faults innermost (they hit the real calls), pauses outermost (after a write succeeded)."""
        from vcasync.testing.faults import FaultPlan, FaultyStorage

        out: Storage = storage
        for n, layer in enumerate(self.faults):
            kwargs = dict(layer)
            seed = int(kwargs.pop("seed", os.getpid() * 31 + n))
            out = FaultyStorage(out, FaultPlan(**kwargs), seed=seed)
        if self.pauses is not None:
            out = self.pauses.wrap_storage(out, state_prefix)
        return out
