"""The coordinator room: the asyncio core that owns the model, the ledger and the run's durable state.

No HTTP here (the server in :mod:`vcasync.server` is a thin skin over it). The public names are
re-exported here; the modules beside them are private and may move:

* ``_coordinator``: the :class:`Coordinator` (join, lease, heartbeat, submit, release, start/stop);
* ``_config`` and ``_args``: its configuration and constructor checks;
* ``_merger``: the merge loop, the one writer of the model; ``_model_owner``: the working model, the
  policy and its state; ``_versions`` and ``_buffers``: published versions and recycled tensor sets;
  ``_counters``: integer tensors as increments;
* ``_result_checks``: the checks on one submitted result before it is merged;
* ``_journal``, ``_snapshots``, ``_run_record``, ``_identity``, ``_storage_health``: durable state on
  a :class:`~vcasync.storage.Storage`, the hand-over of snapshots, what makes a run *this* run, and
  how the storage is doing.
"""

from __future__ import annotations

from ._coordinator import Coordinator, CoordinatorConfig, Durability, StartOptions
from ._model_owner import first_non_finite

__all__ = ["Coordinator", "CoordinatorConfig", "Durability", "StartOptions", "first_non_finite"]
