"""Shared fixtures for the coordinator area: a virtual clock."""

from __future__ import annotations

import contextlib
import importlib.util
import sys

import pytest


def _install_checkpoint_stand_in() -> None:
    """Until ``vcasync.checkpoint`` lands (storage helper), a stand-in with the documented contract:
    data objects first, then the manifest if-absent; ``latest()`` is the newest complete one."""
    if importlib.util.find_spec("vcasync.checkpoint") is not None:
        return
    import hashlib
    import json
    import types
    from dataclasses import dataclass

    from vcasync.errors import CorruptObjectError, ObjectNotFoundError

    @dataclass(frozen=True)
    class Manifest:
        step: int
        objects: dict
        meta: dict

    class CheckpointStore:
        def __init__(self, storage, prefix):
            self.storage, self.prefix = storage, prefix.strip("/")

        def _m(self, step):
            return f"{self.prefix}/{step:016d}/MANIFEST"

        async def write(self, step, objects, meta):
            digests = {}
            for name, data in objects.items():
                await self.storage.put(f"{self.prefix}/{step:016d}/{name}", data)
                digests[name] = hashlib.sha256(data).hexdigest()
            m = Manifest(step, digests, dict(meta))
            await self.storage.put(self._m(step), json.dumps(
                {"step": step, "objects": digests, "meta": m.meta}).encode(), if_absent=True)
            return m

        async def _steps(self):
            return sorted([int(k.split("/")[-2]) async for k in self.storage.list(self.prefix + "/")
                           if k.endswith("/MANIFEST")])

        async def latest(self):
            steps = await self._steps()
            if not steps:
                return None
            d = json.loads(await self.storage.get(self._m(steps[-1])))
            return Manifest(d["step"], d["objects"], d["meta"])

        async def read(self, manifest, name):
            data = await self.storage.get(f"{self.prefix}/{manifest.step:016d}/{name}")
            if hashlib.sha256(data).hexdigest() != manifest.objects[name]:
                raise CorruptObjectError("digest mismatch", key=name)
            return data

        async def prune(self, keep_last):
            for step in (await self._steps())[:-keep_last]:
                async for k in self.storage.list(f"{self.prefix}/{step:016d}/"):
                    with contextlib.suppress(ObjectNotFoundError):
                        await self.storage.delete(k)

    mod = types.ModuleType("vcasync.checkpoint")
    mod.CheckpointStore = CheckpointStore  # type: ignore[attr-defined]
    mod.Manifest = Manifest  # type: ignore[attr-defined]
    sys.modules["vcasync.checkpoint"] = mod


_install_checkpoint_stand_in()


class FakeClock:
    """A clock that moves only when told to: lease expiry is tested in virtual time."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


# -- a small deterministic policy and helpers shared by the coordinator tests ---------------------

from collections.abc import AsyncIterator, Iterable, Mapping  # noqa: E402
from typing import Any, ClassVar  # noqa: E402

import torch  # noqa: E402

from vcasync.errors import UpdateRejectedError  # noqa: E402
from vcasync.tensors import ModelState, Update  # noqa: E402
from vcasync.wire import encode_payload  # noqa: E402


class HalfWay:
    """w <- (w + w_c) / 2 with w_c = base + delta; refuses results whose metrics say ``refuse``."""

    name: ClassVar[str] = "halfway"
    needs_base: ClassVar[bool] = True

    def init_state(self, model: ModelState) -> dict[str, Any]:
        return {"merged": 0, "sum": torch.zeros(())}

    def merge(self, model: ModelState, update: Update, state: dict[str, Any]) -> ModelState:
        if update.metrics.get("refuse"):
            raise UpdateRejectedError("asked to refuse", reason="refused_by_policy")
        for name, w in model.items():
            if not w.is_floating_point():
                continue
            target = update.tensors[name]
            if update.kind == "delta":
                assert update.base is not None
                target = update.base[name] + target
            w.add_(target).mul_(0.5)
        state["merged"] += 1
        state["sum"] = state["sum"] + 1
        return model


def tiny_model(seed: int = 0) -> ModelState:
    g = torch.Generator().manual_seed(seed)
    return ModelState({"w": torch.randn(4, 3, generator=g), "b": torch.randn(3, generator=g),
                       "n": torch.tensor(0, dtype=torch.int64)})


async def stream(chunks: Iterable[bytes]) -> AsyncIterator[bytes]:
    for c in chunks:
        yield c


def result_chunks(lease_id: str, tensors: Mapping[str, torch.Tensor], *, base_version: int = 0,
                  kind: str = "delta", steps: int = 1, **extra: Any) -> list[bytes]:
    meta = {"lease_id": lease_id, "base_version": base_version, "kind": kind, "steps": steps,
            "samples": 8, "partial": False, "metrics": {}, **extra}
    data = b"".join(encode_payload("result", meta, tensors))
    return [data[i:i + 61] for i in range(0, len(data), 61)]     # odd splits, as a network makes


def delta_like(model: ModelState, value: float = 0.25) -> dict[str, torch.Tensor]:
    return {k: (torch.full_like(v, value) if v.is_floating_point() else torch.zeros_like(v))
            for k, v in model.items()}


@pytest.fixture
def policy() -> HalfWay:
    return HalfWay()


@pytest.fixture
def kit() -> Any:
    """The helpers above (test modules cannot import a conftest under --import-mode=importlib)."""
    import types
    return types.SimpleNamespace(HalfWay=HalfWay, tiny_model=tiny_model, stream=stream,
                                 result_chunks=result_chunks, delta_like=delta_like,
                                 FakeClock=FakeClock)
