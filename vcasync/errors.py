"""The one exception tree of vcasync.

Every error vcasync raises on purpose derives from :class:`VCAsyncError`, so a caller can catch
everything with one clause, or exactly one failure with a leaf class::

    VCAsyncError
    ├── ConfigError                   bad configuration: unknown option, wrong type, missing value
    │   ├── StateInUseError           a live worker already holds that worker state URL (``.url``)
    │   └── PriceRowError             a bad price row (``.problem``, ``.key``, ``.where`` in a file)
    ├── ClosedError                   *we* closed the resource (contrast: the peer broke it)
    │   └── CoordinatorGoneError      a worker gave up on an unreachable coordinator (kept its state)
    ├── RequestTimeoutError           the coordinator cut off a request body that came too slowly (408)
    ├── RunIncompleteError            a run stopped at its time limit with work left (exit status 5)
    ├── WireError                     anything wrong with bytes that came off the network
    │   ├── FrameError                malformed, truncated or mis-ordered frames / messages
    │   │   └── UnsupportedMediaTypeError  a body of a content type the route does not read (415)
    │   ├── ProtocolVersionError      a protocol version this build does not speak
    │   ├── LimitExceededError        a declared size is over a configured limit
    │   ├── UnsupportedDtypeError     a dtype (or codec) outside the allow-list
    │   └── ChecksumError             payload bytes do not match their checksum
    ├── ValidationError               a well-formed update that does not fit the model
    │   └── SpecMismatchError         names, shapes or dtypes differ from the model's spec
    ├── StorageError                  a storage backend failed (``.key`` names the object)
    │   ├── ObjectNotFoundError       no object under that key
    │   ├── PreconditionFailedError   if-absent / generation precondition failed (someone else won)
    │   │   └── PrefixTakenError      another coordinator holds the same state prefix: this one stops
    │   ├── AccessDeniedError         the backend refused our credentials (or found none)
    │   ├── BucketNotFoundError       the bucket (or container) the URL names does not exist
    │   ├── TransientStorageError     timeout, 5xx, throttling: retried, then raised
    │   │   └── StorageUnavailableError  the coordinator's storage is failing: wait ``.retry_after``
    │   ├── StorageFailedError        storage stayed unavailable past the limit: the coordinator stopped
    │   ├── CorruptObjectError        an object's digest does not match what its manifest promised
    │   ├── InvalidKeyError           a key (or name) this storage cannot hold: '..', '//', control chars
    │   └── BackendUnavailableError   unknown URL scheme, or an optional dependency is missing
    ├── PolicyError                   merge-policy problems
    │   ├── PluginValidationError     a plugin failed validation when registered (``.plugin``);
    │   │                             also a ConfigError: the installed plugin is what to fix
    │   ├── UnknownPolicyError        no policy registered under that name
    │   ├── PolicyFailedError         merge raised, broke the spec or made the model non-finite
    │   └── UpdateRejectedError       the policy refused an update (``.reason``)
    ├── LedgerError                   work-unit bookkeeping (``.unit_id``, ``.lease_id``)
    │   ├── LeaseNotFoundError        no such lease (never issued, or forgotten)
    │   ├── LeaseExpiredError         the lease's deadline passed; the unit went back to the queue
    │   ├── UnitClosedError           the unit already has a merged result: never merged twice
    │   ├── NotLeaseHolderError       the lease belongs to another worker
    │   ├── NoWorkAvailableError      nothing to lease right now (or the run is finished)
    │   │   ├── WorkerBackoffError    this worker failed recently: no lease for ``retry_after`` s
    │   │   │   └── LeaseLimitError   this worker holds ``max_leases_per_worker`` active leases already
    │   │   └── WorkersFullError      ``max_workers`` worker records are held: no join for now
    │   ├── WorkerQuarantinedError    this worker failed too often in a row: no leases for a long while
    │   └── VersionNotFoundError      that model version is not held (any more): fetch the latest
    ├── TrainerError                  the user's trainer kept failing (not a configuration problem)
    └── AuthError                     missing, malformed, forged, expired or revoked credentials
        ├── OperatorDisabledError     an operator route, but no operator token is configured
        └── StatusDisabledError       status data from off loopback, but no status read token is set

Errors carry context as attributes and say what to do in their message.
"""

from __future__ import annotations

__all__ = [
    "AccessDeniedError",
    "AuthError",
    "BackendUnavailableError",
    "BucketNotFoundError",
    "ChecksumError",
    "ClosedError",
    "ConfigError",
    "CoordinatorGoneError",
    "CorruptObjectError",
    "FrameError",
    "InvalidKeyError",
    "LeaseExpiredError",
    "LeaseLimitError",
    "LeaseNotFoundError",
    "LedgerError",
    "LimitExceededError",
    "NoWorkAvailableError",
    "NotLeaseHolderError",
    "OperatorDisabledError",
    "ObjectNotFoundError",
    "PluginValidationError",
    "PolicyError",
    "PolicyFailedError",
    "PreconditionFailedError",
    "PrefixTakenError",
    "PriceRowError",
    "ProtocolVersionError",
    "RequestTimeoutError",
    "RunIncompleteError",
    "SpecMismatchError",
    "StateInUseError",
    "StatusDisabledError",
    "StorageError",
    "StorageFailedError",
    "StorageUnavailableError",
    "TrainerError",
    "TransientStorageError",
    "UnitClosedError",
    "UnknownPolicyError",
    "UnsupportedDtypeError",
    "UnsupportedMediaTypeError",
    "UpdateRejectedError",
    "VCAsyncError",
    "ValidationError",
    "VersionNotFoundError",
    "WireError",
    "WorkerBackoffError",
    "WorkerQuarantinedError",
    "WorkersFullError",
]


class VCAsyncError(Exception):
    """Root of every error vcasync raises on purpose."""


class ConfigError(VCAsyncError):
    """The configuration is wrong: an unknown option, a wrong type, a missing value."""


class StateInUseError(ConfigError):
    """A live worker holds the worker state at ``url`` (``holder`` says which, when known): two workers
    on one state would overwrite each other's checkpoints. Give each worker its own state URL."""

    def __init__(self, message: str, *, url: str = "", holder: str | None = None) -> None:
        super().__init__(message)
        self.url = url
        self.holder = holder


class PriceRowError(ConfigError):
    """A price row (``vcasync.costing.InstancePrice``) that cannot be built: ``problem`` says which
    field and why, ``key`` names the row (``provider:instance``; None until both are names) and
    ``where`` says where it sits in a file (``price row 2``, ``line 3``) once the loader knows.

    The message is built here, once: ``price row KEY: PROBLEM`` from the row itself, ``WHERE (KEY):
    PROBLEM`` from a file; :meth:`at` adds the place without parsing the message."""

    def __init__(self, problem: str, *, key: str | None = None, where: str | None = None) -> None:
        self.problem = problem
        self.key = key
        self.where = where
        if where is None:
            head = f"price row {key}" if key is not None else "price row"
        else:
            head = f"{where} ({key})" if key is not None else where
        super().__init__(f"{head}: {problem}")

    def at(self, where: str) -> PriceRowError:
        """The same error, placed at ``where`` in a file."""
        return PriceRowError(self.problem, key=self.key, where=where)


class ClosedError(VCAsyncError):
    """The resource was closed by its owner; create a new one instead of reusing it."""


class CoordinatorGoneError(ClosedError):
    """A worker gave up on a coordinator unreachable for its ``give_up_after_s``: nothing was
    refused, so its lease, checkpoint and spooled result stay for a restart to use."""


class RequestTimeoutError(VCAsyncError):
    """The coordinator cut a request off because its body came too slowly or stalled (``408
    request_timeout``, see docs/limits.md): nothing of it was taken in, and the same request may be
    sent again (a result under the same lease). Transient: a slow or stalled link, not a refusal."""


class RunIncompleteError(VCAsyncError):
    """A run stopped before all its work was done: at its time limit (``vcasync demo --max-wall``), or
    a demo whose workers gave up after repeated crashes (the message names the cause): nothing is
    wrong with the configuration, and what was done is kept and reported."""


# --- wire -----------------------------------------------------------------------------------


class WireError(VCAsyncError):
    """Bytes from the network could not be decoded safely. ``field`` names what was wrong."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class FrameError(WireError):
    """Malformed, truncated or out-of-order frames or messages."""


class UnsupportedMediaTypeError(FrameError):
    """A request body of a content type the route does not read (a control route reads JSON or
    msgpack); nothing was read or changed."""


class ProtocolVersionError(WireError):
    """The peer speaks a protocol version this build does not."""


class LimitExceededError(WireError):
    """A declared size exceeds a configured limit; nothing was allocated."""

    def __init__(self, message: str, *, field: str | None = None, limit: int | None = None,
                 value: int | None = None) -> None:
        super().__init__(message, field=field)
        self.limit = limit
        self.value = value


class UnsupportedDtypeError(WireError):
    """A dtype or codec outside the allow-list."""


class ChecksumError(WireError):
    """Payload bytes do not match their declared checksum."""


# --- validation -----------------------------------------------------------------------------


class ValidationError(VCAsyncError):
    """A well-formed update that cannot be merged into this model."""

    def __init__(self, message: str, *, reason: str = "invalid", name: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.name = name


class SpecMismatchError(ValidationError):
    """Tensor names, shapes or dtypes differ from the model's spec."""


# --- storage --------------------------------------------------------------------------------


class StorageError(VCAsyncError):
    """A storage backend failed. ``key`` names the object when there is one."""

    def __init__(self, message: str, *, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


class ObjectNotFoundError(StorageError):
    """No object exists under the key."""


class PreconditionFailedError(StorageError):
    """A conditional write lost: the object already exists or its generation changed."""


class PrefixTakenError(PreconditionFailedError):
    """Another coordinator holds or writes the same state prefix: a live one holds the run's owner
    lease (a start is refused, the message names it), took the run over while this one stalled, or
    wrote a journal entry this one was about to write. Two coordinators on one run would lose each
    other's results, so this one stops. Give each coordinator its own prefix; restart this one once
    the other is gone."""


class AccessDeniedError(StorageError):
    """The backend refused the credentials in use."""


class BucketNotFoundError(StorageError):
    """The bucket the storage URL names does not exist (or is not visible to these credentials).
    ``bucket`` names it; create it, or fix the URL."""

    def __init__(self, message: str, *, bucket: str | None = None, key: str | None = None) -> None:
        super().__init__(message, key=key)
        self.bucket = bucket


class TransientStorageError(StorageError):
    """A timeout, 5xx or throttling answer that persisted through every retry."""


class StorageUnavailableError(TransientStorageError):
    """The coordinator cannot make anything durable right now (its storage is failing), so it took
    nothing in: keep the result (or the wish for work) and ask again in ``retry_after`` seconds.
    It is the coordinator's storage that is down, not the coordinator."""

    def __init__(self, message: str, *, key: str | None = None, retry_after: float = 5.0) -> None:
        super().__init__(message, key=key)
        self.retry_after = retry_after


class StorageFailedError(StorageError):
    """Storage stayed unavailable past the coordinator's limit (``storage_outage_limit_s``), so the
    run cannot make progress; the coordinator stopped (``vcasync coordinator`` exits with
    ``ExitCode.STORAGE``). Everything acknowledged before the outage is in the storage's journal."""


class CorruptObjectError(StorageError):
    """An object's bytes do not match the digest its manifest recorded."""


class InvalidKeyError(StorageError):
    """The key is malformed (empty, absolute, ``..``, ``//``, control characters, too long) or
    cannot be stored by this backend (for ``file://``: an object and a prefix with the same name)."""


class BackendUnavailableError(StorageError):
    """No backend for the URL scheme, or its optional dependency is not installed."""


# --- policies -------------------------------------------------------------------------------


class PolicyError(VCAsyncError):
    """A merge-policy problem."""


class PluginValidationError(PolicyError, ConfigError):
    """A plugin did not pass validation when it was registered (or could not be imported).
    ``plugin`` names it. Also a :class:`ConfigError`: what is installed is wrong, so
    ``vcasync coordinator`` exits 2 (configuration), not 1 ("restart and the run resumes")."""

    def __init__(self, message: str, *, plugin: str) -> None:
        super().__init__(f"plugin {plugin!r}: {message}")
        self.plugin = plugin


class UnknownPolicyError(PolicyError):
    """No policy is registered under the requested name."""


class PolicyFailedError(PolicyError, ConfigError):
    """The merge policy failed on a result: its ``merge`` raised, returned tensors that break the
    model's spec (dtype, shape, names), or made the model non-finite. The model stays as it was and
    the result is refused (reason ``policy``); it is the policy's fault, not the worker's. After
    a few such failures in a row the coordinator stops with this error (``vcasync
    coordinator`` exits with ``ExitCode.CONFIG``: fix or replace the policy). ``policy`` names it."""

    reason = "policy"

    def __init__(self, message: str, *, policy: str = "") -> None:
        super().__init__(message)
        self.policy = policy


class UpdateRejectedError(PolicyError):
    """The policy refused an update; ``reason`` is short and machine-readable."""

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


# --- ledger ---------------------------------------------------------------------------------


class LedgerError(VCAsyncError):
    """Work-unit bookkeeping failed. ``unit_id`` and ``lease_id`` give the context."""

    def __init__(self, message: str, *, unit_id: str | None = None,
                 lease_id: str | None = None) -> None:
        super().__init__(message)
        self.unit_id = unit_id
        self.lease_id = lease_id


class LeaseNotFoundError(LedgerError):
    """No such lease: it was never issued, or it was forgotten."""


class LeaseExpiredError(LedgerError):
    """The lease's deadline passed; its unit went back to the queue. Lease again."""


class UnitClosedError(LedgerError):
    """The unit already has a merged result; a second one is never merged."""


class NotLeaseHolderError(LedgerError):
    """The lease belongs to another worker."""


class NoWorkAvailableError(LedgerError):
    """Nothing to lease now; ``retry_after`` seconds is a hint, ``finished`` ends the run."""

    def __init__(self, message: str, *, retry_after: float = 1.0, finished: bool = False) -> None:
        super().__init__(message)
        self.retry_after = retry_after
        self.finished = finished


class WorkerBackoffError(NoWorkAvailableError):
    """This worker's last units failed: it gets no lease for ``retry_after`` seconds, so the unit
    it failed goes to another worker first. Wait, then lease again."""


class LeaseLimitError(WorkerBackoffError):
    """This worker holds ``held`` active leases, the coordinator's ``max_leases_per_worker``
    (``limit``): it gets no other until one of them ends (a result, a release, an expiry), about
    ``retry_after`` seconds from now. One worker must not hold the units the rest of the fleet is
    waiting for. Finish (or release) what you hold, then lease again."""

    def __init__(self, message: str, *, retry_after: float = 1.0, limit: int | None = None,
                 held: int | None = None) -> None:
        super().__init__(message, retry_after=retry_after)
        self.limit = limit
        self.held = held


class WorkersFullError(NoWorkAvailableError):
    """The coordinator holds ``held`` worker records, its ``max_workers`` (``limit``), and none of
    them could be forgotten: a new worker is not registered now. Workers that already joined are
    unaffected. Join again in ``retry_after`` seconds."""

    def __init__(self, message: str, *, retry_after: float = 30.0, limit: int | None = None,
                 held: int | None = None) -> None:
        super().__init__(message, retry_after=retry_after)
        self.limit = limit
        self.held = held


class WorkerQuarantinedError(LedgerError):
    """This worker failed ``quarantine_after`` units in a row: it gets no leases for
    ``retry_after`` seconds (None: the rest of the run). Fix the machine or the trainer; an operator
    sees it in the coordinator's status."""

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class VersionNotFoundError(LedgerError):
    """The coordinator does not hold that model version (never made, or dropped from its window)."""

    def __init__(self, message: str, *, version: int | None = None) -> None:
        super().__init__(message)
        self.version = version


# --- trainer --------------------------------------------------------------------------------


class TrainerError(VCAsyncError):
    """The user's trainer failed on unit after unit; its own errors are in the worker's log."""


# --- auth -----------------------------------------------------------------------------------


class AuthError(VCAsyncError):
    """Missing, malformed, forged, expired or revoked credentials."""


class OperatorDisabledError(AuthError):
    """An operator route was called, but the coordinator has no operator token configured
    (``VCASYNC_OPERATOR_TOKEN`` or ``--operator-token-file``): operator actions are off."""


class StatusDisabledError(AuthError):
    """The status page's data was asked for from a non-loopback address, but the coordinator has no
    status read token (``VCASYNC_STATUS_TOKEN`` or ``--status-token-file``): it is loopback-only."""
