"""vcasync: asynchronous training of PyTorch models on fleets of preemptible machines.

The public surface is what ``__all__`` lists; everything else may move. Every name but the errors
loads on first use (``vcasync.Coordinator`` imports :mod:`vcasync.coordinator` then), so ``import
vcasync`` imports neither torch nor aiohttp: the ``vcasync`` command takes over SIGTERM and SIGINT
first thing, before those (seconds on a loaded machine), and a worker preempted while it starts
exits as documented (see :mod:`vcasync._early_signals`).
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

from .errors import (
    AuthError,
    ConfigError,
    LedgerError,
    NoWorkAvailableError,
    PluginValidationError,
    PolicyError,
    StorageError,
    UnknownPolicyError,
    UpdateRejectedError,
    ValidationError,
    VCAsyncError,
    WireError,
)

if TYPE_CHECKING:
    from .checkpoint import CheckpointStore, Manifest
    from .coordinator import Coordinator, CoordinatorConfig, StartOptions
    from .ledger import LeaseGrant, Ledger, LedgerConfig, Receipt, WorkUnit, make_units
    from .metrics import Metrics
    from .policy import (
        MergePolicy,
        PolicySpec,
        PolicyState,
        available_policies,
        build_policy,
        policy_from_config,
        policy_spec,
        register_policy,
        unregister_policy,
    )
    from .retry import RetryPolicy
    from .server import Server, ServerConfig
    from .server._auth import TokenAuthority
    from .storage import ObjectInfo, Storage, available_backends, open_storage, register_backend
    from .tensors import ModelSpec, ModelState, TensorSpec, Update, counter_increments, make_delta
    from .trainer import TrainContext, TrainResult
    from .wire import (
        CodecSpec,
        Limits,
        LinkProfile,
        Payload,
        decode_payload,
        decode_payload_bytes,
        encode_payload,
        pack_tree,
        unpack_tree,
    )
    from .worker import Worker, WorkerConfig, WorkerReport
    from .worker._client import CoordinatorClient

__version__ = "0.1.0"

#: name -> module of everything but the errors, loaded on first attribute access: ``import
#: vcasync`` (and so ``import vcasync.cli``) loads neither torch nor aiohttp, so the ``vcasync``
#: command can take over SIGTERM and SIGINT before its heavy imports (:mod:`vcasync._early_signals`).
_LAZY = {
    "CheckpointStore": "checkpoint",
    "Manifest": "checkpoint",
    "Coordinator": "coordinator",
    "CoordinatorConfig": "coordinator",
    "StartOptions": "coordinator",
    "LeaseGrant": "ledger",
    "Ledger": "ledger",
    "LedgerConfig": "ledger",
    "Receipt": "ledger",
    "WorkUnit": "ledger",
    "make_units": "ledger",
    "Metrics": "metrics",
    "MergePolicy": "policy",
    "PolicySpec": "policy",
    "PolicyState": "policy",
    "available_policies": "policy",
    "build_policy": "policy",
    "policy_from_config": "policy",
    "policy_spec": "policy",
    "register_policy": "policy",
    "unregister_policy": "policy",
    "RetryPolicy": "retry",
    "ObjectInfo": "storage",
    "Storage": "storage",
    "available_backends": "storage",
    "open_storage": "storage",
    "register_backend": "storage",
    "ModelSpec": "tensors",
    "ModelState": "tensors",
    "TensorSpec": "tensors",
    "Update": "tensors",
    "counter_increments": "tensors",
    "make_delta": "tensors",
    "CodecSpec": "wire",
    "Limits": "wire",
    "LinkProfile": "wire",
    "Payload": "wire",
    "decode_payload": "wire",
    "decode_payload_bytes": "wire",
    "encode_payload": "wire",
    "pack_tree": "wire",
    "unpack_tree": "wire",
    "TokenAuthority": "server._auth",
    "CoordinatorClient": "worker._client",
    "Server": "server",
    "ServerConfig": "server",
    "TrainContext": "trainer",
    "TrainResult": "trainer",
    "Worker": "worker",
    "WorkerConfig": "worker",
    "WorkerReport": "worker",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        # ``import vcasync; vcasync.storage.open_storage(...)`` worked while this module imported
        # its submodules itself: a submodule still loads on first use
        if not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
            return importlib.import_module(f".{name}", __name__)
        raise AttributeError(f"module 'vcasync' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


__all__ = [
    "AuthError",
    "CheckpointStore",
    "CodecSpec",
    "ConfigError",
    "Coordinator",
    "CoordinatorClient",
    "CoordinatorConfig",
    "LeaseGrant",
    "Ledger",
    "LedgerConfig",
    "LedgerError",
    "Limits",
    "LinkProfile",
    "Manifest",
    "MergePolicy",
    "Metrics",
    "ModelSpec",
    "ModelState",
    "NoWorkAvailableError",
    "ObjectInfo",
    "Payload",
    "PluginValidationError",
    "PolicyError",
    "PolicySpec",
    "PolicyState",
    "Receipt",
    "RetryPolicy",
    "Server",
    "ServerConfig",
    "StartOptions",
    "Storage",
    "StorageError",
    "TensorSpec",
    "TokenAuthority",
    "TrainContext",
    "TrainResult",
    "UnknownPolicyError",
    "Update",
    "UpdateRejectedError",
    "VCAsyncError",
    "ValidationError",
    "WireError",
    "WorkUnit",
    "Worker",
    "WorkerConfig",
    "WorkerReport",
    "__version__",
    "available_backends",
    "available_policies",
    "build_policy",
    "counter_increments",
    "decode_payload",
    "decode_payload_bytes",
    "encode_payload",
    "make_delta",
    "make_units",
    "open_storage",
    "pack_tree",
    "policy_from_config",
    "policy_spec",
    "register_backend",
    "register_policy",
    "unpack_tree",
    "unregister_policy",
]
