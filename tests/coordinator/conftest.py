"""Shared fixtures for the coordinator area: a virtual clock."""

from __future__ import annotations

import pytest


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
    claims: ClassVar[frozenset[str]] = frozenset()

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


@pytest.fixture(params=["memory", "file"])
async def storage(request: pytest.FixtureRequest, tmp_path: Any) -> AsyncIterator[Any]:
    """A store of each local kind, for the crash-safety tests (files that need another store
    define their own ``storage``, which wins over this one)."""
    from vcasync.storage import open_storage

    name = request.module.__name__.rsplit(".", 1)[-1].removeprefix("test_")   # flush, recovery
    url = f"memory://{name}" if request.param == "memory" else f"file://{tmp_path}/state"
    st = open_storage(url)
    yield st
    await st.aclose()
