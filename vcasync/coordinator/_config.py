"""The coordinator's configuration: one frozen dataclass, validated on construction."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .. import _owner_lease
from ..errors import ConfigError, InvalidKeyError
from ..ledger import LedgerConfig
from ..retry import WORKER_BACKOFF
from ..storage import validate_prefix
from ..wire import Limits, resolve_codec
from ._journal import Durability, JournalConfig

#: After this many results in a row that the merge policy refused (``UpdateRejectedError``: gate's
#: ``norm_outlier``, ...), from at least two distinct workers and with no result accepted in
#: between, the merge loop stops the coordinator with PolicyFailedError (the default of
#: ``CoordinatorConfig.policy_refusal_limit``): a policy that refuses the whole fleet leaves the
#: model unchanged, so it refuses the same results for ever.
POLICY_REFUSAL_LIMIT = 50

#: The longest lease timeout: a week (a lease without progress for this long expires, and only then
#: does another worker get its unit).
MAX_LEASE_TIMEOUT_S = 7 * 24 * 3600.0
#: A worker's longest wait between two tries of a call the coordinator did not answer (10 s).
RETRY_CAP_S = WORKER_BACKOFF.max_delay_s

__all__ = ["CoordinatorConfig", "Durability"]

GiB = 1 << 30


@dataclass(frozen=True, slots=True)
class CoordinatorConfig:
    """Everything a coordinator is told; validated here so a typo fails before anything starts."""

    max_staleness: int = 16               # results based on older versions are refused
    durability: Durability = "journal"    # journal: each result durable before its ack; see docs/concepts.md
    snapshot_every: int = 100             # results between snapshots ...
    snapshot_interval_s: float = 60.0     # ... and at most this long when something changed
    keep_snapshots: int = 2               # while running, each with the journal entries after it
    #: At close, delete what the final snapshot covers: the journal entries and the older snapshots
    #: (without those entries they would be fallbacks that drop results). False keeps the whole
    #: history that ``keep_snapshots`` kept (audits, post-mortems).
    prune_on_close: bool = True
    lease_timeout_s: float = 60.0         # a lease without progress for this long expires
    heartbeat_interval_s: float | None = None   # at most lease_timeout_s / 3; None: lease_timeout_s / 4
    max_attempts: int = 5                 # failures of a unit before it may park ...
    deadline_slack: float = 3.0           # a deadline is at least this x the worker's seconds per step
    park_after_workers: int = 3           # distinct workers that must fail a unit before it parks
    worker_backoff_s: float = 1.0         # a failing worker waits this, doubled per failure in a row,
    worker_backoff_max_s: float = 60.0    # ... up to this, before its next lease
    quarantine_after: int = 5             # failures in a row that stop a worker getting work ...
    quarantine_s: float | None = 3600.0   # ... for this long (None or inf: the rest of the run)
    forget_workers_s: float | None = 3600.0   # drop records of workers silent this long (no lease,
                                          # back-off or quarantine); None or inf: keep them all
    max_leases_per_worker: int | float | None = 4   # active leases one worker may hold (429
                                          # lease_limit past it); None or inf: no cap
    max_workers: int | float | None = 100_000   # worker records kept: a join when full forgets
                                          # silent ones, or is refused (503 workers_full); None
                                          # or inf: no cap
    #: The merge policy refusing this many results in a row (``UpdateRejectedError``, e.g. gate's
    #: ``norm_outlier``), from at least two workers and none accepted in between, stops the
    #: coordinator with PolicyFailedError (``vcasync coordinator`` exits 2): the fleet is locked
    #: out. None (from Python): never stop for it.
    policy_refusal_limit: int | None = POLICY_REFUSAL_LIMIT
    require_finite: bool = True           # refuse results holding NaN or Inf
    max_update_norm: float | None = None  # refuse results whose delta norm is larger (None: no limit)
    limits: Limits = field(default_factory=Limits)
    model_codec: str = "raw"              # how model downloads are encoded (unless asked otherwise)
    journal_codec: str = "raw"            # how journal entries and snapshots are encoded
    max_retained_bytes: int | None = 4 * GiB   # old versions kept for deltas and downloads
    max_concurrent_decodes: int = 2       # uploads decoded at once; each slot may keep one
                                          # model-sized set mapped (shared with version copies)
    state_prefix: str = "vcasync"         # where on the storage the coordinator keeps its state
    expiry_interval_s: float = 1.0        # how often expired leases are looked for
    #: While storage is unavailable, probe writes check whether it is back: after 0.1 s, then at
    #: doubling intervals up to this one (workers are told to retry about when the next is due) ...
    storage_probe_interval_s: float = 5.0
    #: ... and how long it may stay unavailable before the coordinator gives up and stops
    #: (``vcasync coordinator`` exits with ``ExitCode.STORAGE``).
    storage_outage_limit_s: float = 600.0
    #: One live coordinator per run: the one serving renews an owner record under the state prefix
    #: every third of this; a start that finds a live one is refused, and one that stopped renewing
    #: (killed elsewhere) is taken over after this long (at once when it released it at a clean
    #: stop, or provably died on this machine). At least 3 s: a renewal is several storage round
    #: trips (about five on S3 or GCS). See docs/runs.md.
    owner_ttl_s: float = 30.0
    #: After taking a run over from a coordinator that did not stop cleanly (SIGKILL, a lost
    #: machine), leases it granted after its last snapshot are unknown until their workers call in
    #: (a heartbeat or the result adopts them), so for this long no *new* lease is granted: an idle
    #: worker would otherwise be handed a unit another worker is training, and one of the two
    #: results be thrown away. None: one heartbeat interval and a worker's longest retry delay (10 s);
    #: 0: grant at once. See docs/leases.md#restarts.
    restart_grace_s: float | None = None

    def __post_init__(self) -> None:
        def need(ok: bool, name: str, what: str) -> None:
            if not ok:
                raise ConfigError(f"CoordinatorConfig.{name} {what}, got {getattr(self, name)!r}")

        def count(name: str, minimum: int) -> None:
            v = getattr(self, name)
            need(isinstance(v, int) and not isinstance(v, bool) and v >= minimum, name,
                 f"must be an int >= {minimum}")

        count("max_staleness", 0)
        count("snapshot_every", 1)
        count("keep_snapshots", 1)
        count("max_concurrent_decodes", 1)
        if self.policy_refusal_limit is not None:
            count("policy_refusal_limit", 1)
        need(self.durability in ("journal", "snapshot", "none"), "durability",
             "must be 'journal', 'snapshot' or 'none'")
        need(self.snapshot_interval_s > 0, "snapshot_interval_s", "must be > 0")
        need(self.expiry_interval_s > 0, "expiry_interval_s", "must be > 0")
        need(self.storage_probe_interval_s > 0, "storage_probe_interval_s", "must be > 0")
        need(self.storage_outage_limit_s > 0, "storage_outage_limit_s", "must be > 0")
        need(self.owner_ttl_s >= _owner_lease.MIN_TTL_S, "owner_ttl_s",
             f"must be >= {_owner_lease.MIN_TTL_S:g} s (renewed every third of it, each renewal "
             "several storage round trips: a shorter TTL gets a live coordinator taken over)")
        need(not self.owner_ttl_s > _owner_lease.MAX_TTL_S, "owner_ttl_s",
             f"must be at most {_owner_lease.MAX_TTL_S:g} s (a day: after a crash, a start on "
             "another machine waits up to this long before it takes the run over)")
        need(self.max_update_norm is None or self.max_update_norm > 0, "max_update_norm",
             "must be > 0 or None")
        need(self.max_retained_bytes is None or self.max_retained_bytes >= 0, "max_retained_bytes",
             "must be >= 0 or None")
        need(isinstance(self.limits, Limits), "limits", "must be a vcasync.wire.Limits")
        need(isinstance(self.state_prefix, str) and bool(self.state_prefix.strip("/")),
             "state_prefix", "must be a non-empty key prefix")
        try:
            validate_prefix(self.state_prefix)
        except InvalidKeyError as exc:    # '../up' was exit 1 at the first write, not a config error
            raise ConfigError(f"CoordinatorConfig.state_prefix {self.state_prefix!r}: {exc}") from None
        for name in ("snapshot_interval_s", "expiry_interval_s", "storage_probe_interval_s",
                     "storage_outage_limit_s", "owner_ttl_s"):
            need(math.isfinite(getattr(self, name)), name, "must be finite")
        need(self.restart_grace_s is None or (math.isfinite(self.restart_grace_s)
                                              and 0 <= self.restart_grace_s <= 3600),
             "restart_grace_s", "must be None or a number of seconds in [0, 3600]")
        for name in ("model_codec", "journal_codec"):
            try:
                resolve_codec(getattr(self, name))
            except (ConfigError, ValueError, TypeError) as exc:
                raise ConfigError(f"CoordinatorConfig.{name}: {exc}") from None
        # Workers heartbeat as often as their lease grant says, which is this setting: 50 s on a
        # lease of 4 s let every lease expire between heartbeats, and a unit was leased again and
        # trained twice. A third of the timeout leaves room for one lost heartbeat.
        need(math.isfinite(self.lease_timeout_s), "lease_timeout_s",
             "must be finite (workers heartbeat at a fraction of it)")
        # 1e308 was taken: a dead worker's unit then waits for ever before another gets it
        need(self.lease_timeout_s <= MAX_LEASE_TIMEOUT_S, "lease_timeout_s",
             f"must be at most {MAX_LEASE_TIMEOUT_S:g} s (a week: a dead worker's unit waits this long "
             "before another worker gets it)")
        self.ledger_config()   # lease settings are checked by the ledger's own config
        need(self.heartbeat_interval_s is None or self.heartbeat_interval_s <= self.lease_timeout_s / 3,
             "heartbeat_interval_s", f"must be at most a third of lease_timeout_s "
             f"({self.lease_timeout_s / 3:g} s), or a lease expires between two heartbeats")

    def restart_grace(self) -> float:
        """Seconds without new leases after taking a run over from a crashed coordinator."""
        if self.restart_grace_s is not None:
            return self.restart_grace_s
        return self.ledger_config().heartbeat_s + RETRY_CAP_S

    def journal_config(self) -> JournalConfig:
        return JournalConfig(durability=self.durability, state_prefix=self.state_prefix,
                             limits=self.limits, codec=self.journal_codec,
                             keep_snapshots=self.keep_snapshots, prune_on_close=self.prune_on_close,
                             max_staleness=self.max_staleness)

    def ledger_config(self) -> LedgerConfig:
        return LedgerConfig(lease_timeout_s=self.lease_timeout_s,
                            heartbeat_interval_s=self.heartbeat_interval_s,
                            max_attempts=self.max_attempts, deadline_slack=self.deadline_slack,
                            park_after_workers=self.park_after_workers,
                            worker_backoff_s=self.worker_backoff_s,
                            worker_backoff_max_s=self.worker_backoff_max_s,
                            quarantine_after=self.quarantine_after,
                            quarantine_s=self.quarantine_s,
                            forget_workers_s=self.forget_workers_s,
                            max_leases_per_worker=self.max_leases_per_worker,
                            max_workers=self.max_workers)
