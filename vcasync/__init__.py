"""vcasync: asynchronous training of PyTorch models on fleets of preemptible machines.

The public surface is what ``__all__`` lists; everything else may move.
"""

from __future__ import annotations

from .errors import (
    AuthError,
    ConfigError,
    LedgerError,
    PolicyError,
    StorageError,
    ValidationError,
    VCAsyncError,
    WireError,
)
from .policy import MergePolicy, PolicyState
from .storage import ObjectInfo, Storage
from .tensors import ModelSpec, ModelState, TensorSpec, Update

__version__ = "0.1.0"

__all__ = [
    "AuthError",
    "ConfigError",
    "LedgerError",
    "MergePolicy",
    "ModelSpec",
    "ModelState",
    "ObjectInfo",
    "PolicyError",
    "PolicyState",
    "Storage",
    "StorageError",
    "TensorSpec",
    "Update",
    "VCAsyncError",
    "ValidationError",
    "WireError",
    "__version__",
]
