"""vcasync: asynchronous training of PyTorch models on fleets of preemptible machines.

The public surface is what ``__all__`` lists; everything else may move. The HTTP side (``Server``,
``Worker``, ``CoordinatorClient`` and friends) loads on first use, so ``import vcasync`` stays light
for embedded use of the coordinator, policies and storage.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .checkpoint import CheckpointStore, Manifest
from .coordinator import Coordinator, CoordinatorConfig, StartOptions
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
from .storage import ObjectInfo, Storage, available_backends, open_storage, register_backend
from .tensors import ModelSpec, ModelState, TensorSpec, Update, counter_increments, make_delta
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

if TYPE_CHECKING:
    from .server import Server, ServerConfig
    from .server._auth import TokenAuthority
    from .trainer import TrainContext, TrainResult
    from .worker import Worker, WorkerConfig, WorkerReport
    from .worker._client import CoordinatorClient

__version__ = "0.1.0"

#: name -> module for the parts that import aiohttp; loaded on first attribute access.
_LAZY = {
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
        raise AttributeError(f"module 'vcasync' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


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
