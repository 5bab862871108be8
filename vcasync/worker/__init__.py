"""The worker room: join, lease, fetch the model, train, upload the result, repeat.

The public names are re-exported here; the modules beside them are private: ``_worker`` (the loop),
``_client`` (one method per route of the coordinator's API), ``_io`` (models in, results out),
``_state_dir`` (the local state directory), ``_remote_state`` (worker state kept in a Storage, one
live worker per state URL by the owner lease of :mod:`vcasync._owner_lease`).
"""

from __future__ import annotations

from ._worker import Worker, WorkerConfig, WorkerReport

__all__ = ["Worker", "WorkerConfig", "WorkerReport"]
