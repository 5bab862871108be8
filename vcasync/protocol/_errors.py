"""One table from the exception tree to HTTP, used by the server to answer and the client to re-raise.

Every error the server returns is a 4xx/5xx with a JSON body ``{"error": code, "message": ...,
<context fields>}``. The status and code come from :data:`HTTP_ERRORS`, looked up along the class's
MRO so a subclass without an entry inherits its parent's. The client turns the code back into the same
exception class with the same context fields, so ``except LeaseExpiredError`` works across the wire.

Choices worth knowing:

* ``NoWorkAvailableError`` is ``503`` with ``Retry-After`` while units are leased out elsewhere, and
  ``410 run_finished`` once every unit is merged (the run is gone for good, do not retry).
* A storage failure on the coordinator's side is ``503 storage_unavailable`` with ``Retry-After``:
  nothing was taken in, so the worker keeps its result and waits; the code names storage so the
  worker does not blame the coordinator (or the network). The client rebuilds it as
  :class:`~vcasync.errors.StorageUnavailableError`.
* ``AuthError`` is ``401`` (with ``WWW-Authenticate: Bearer``); ``NotLeaseHolderError`` is ``403``:
  the caller is known but the lease is someone else's. ``WorkerBackoffError`` is ``429`` with
  ``retry_after``, and so is ``LeaseLimitError`` (``429 lease_limit``: the worker holds
  ``max_leases_per_worker`` leases, body fields ``limit`` and ``held``); ``WorkersFullError`` is
  ``503 workers_full`` with ``Retry-After`` (a join while ``max_workers`` records are held);
  ``WorkerQuarantinedError``, ``OperatorDisabledError`` and ``StatusDisabledError`` are ``403``.
* ``LimitExceededError`` is ``413``; a payload that is well formed but does not fit the model
  (``ValidationError``, ``SpecMismatchError``, a dtype outside the allow-list, a policy refusal) is
  ``422``; any other ``WireError`` is ``400``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from .. import errors as E

__all__ = ["CONTEXT_FIELDS", "HTTP_ERRORS", "ErrorSpec", "error_fields", "error_from_body", "spec_for"]


@dataclass(frozen=True, slots=True)
class ErrorSpec:
    """How one exception class travels: HTTP status and a stable machine-readable code."""

    status: int
    code: str
    #: Optional refinement on the instance (e.g. a finished run is 410, not 503).
    refine: Callable[[BaseException], ErrorSpec | None] | None = None


def _no_work(exc: BaseException) -> ErrorSpec | None:
    if isinstance(exc, E.NoWorkAvailableError) and exc.finished:
        return _RUN_FINISHED
    return None


_RUN_FINISHED: Final = ErrorSpec(410, "run_finished")

HTTP_ERRORS: Final[Mapping[type[BaseException], ErrorSpec]] = {
    E.VCAsyncError: ErrorSpec(500, "internal_error"),
    E.ConfigError: ErrorSpec(500, "config_error"),
    E.ClosedError: ErrorSpec(503, "shutting_down"),
    # Answered by the server's body pacing (BodyCutOff), never raised there as this class: the
    # client rebuilds it so that a worker re-sends what a slow or stalled link had cut off.
    E.RequestTimeoutError: ErrorSpec(408, "request_timeout"),
    E.WireError: ErrorSpec(400, "bad_payload"),
    E.FrameError: ErrorSpec(400, "malformed_payload"),
    E.UnsupportedMediaTypeError: ErrorSpec(415, "unsupported_media_type"),
    E.ProtocolVersionError: ErrorSpec(400, "protocol_version"),
    E.LimitExceededError: ErrorSpec(413, "limit_exceeded"),
    E.UnsupportedDtypeError: ErrorSpec(422, "unsupported_dtype"),
    E.ChecksumError: ErrorSpec(400, "checksum_mismatch"),
    E.ValidationError: ErrorSpec(422, "invalid_update"),
    E.SpecMismatchError: ErrorSpec(422, "spec_mismatch"),
    E.StorageError: ErrorSpec(500, "storage_error"),
    # The coordinator answers a storage failure as StorageUnavailableError (nothing taken in, wait
    # ``retry_after``); a bare transient error keeps its own code so each class comes back as itself.
    E.TransientStorageError: ErrorSpec(503, "storage_transient"),
    E.StorageUnavailableError: ErrorSpec(503, "storage_unavailable"),
    E.StorageFailedError: ErrorSpec(503, "storage_failed"),
    E.PolicyError: ErrorSpec(500, "policy_error"),
    E.UpdateRejectedError: ErrorSpec(422, "update_rejected"),
    E.LedgerError: ErrorSpec(409, "ledger_conflict"),
    E.LeaseNotFoundError: ErrorSpec(404, "lease_not_found"),
    E.LeaseExpiredError: ErrorSpec(410, "lease_expired"),
    E.UnitClosedError: ErrorSpec(409, "unit_closed"),
    E.NotLeaseHolderError: ErrorSpec(403, "not_lease_holder"),
    E.VersionNotFoundError: ErrorSpec(404, "version_not_found"),
    E.NoWorkAvailableError: ErrorSpec(503, "no_work", refine=_no_work),
    E.WorkerBackoffError: ErrorSpec(429, "worker_backoff"),
    E.LeaseLimitError: ErrorSpec(429, "lease_limit"),
    E.WorkersFullError: ErrorSpec(503, "workers_full"),
    E.WorkerQuarantinedError: ErrorSpec(403, "worker_quarantined"),
    E.TrainerError: ErrorSpec(500, "trainer_error"),
    E.AuthError: ErrorSpec(401, "unauthorized"),
    E.OperatorDisabledError: ErrorSpec(403, "operator_disabled"),
    E.StatusDisabledError: ErrorSpec(403, "status_disabled"),
}

#: Attributes copied from an exception into the JSON body (when present and not None).
CONTEXT_FIELDS: Final = ("field", "limit", "value", "reason", "name", "key", "unit_id", "lease_id",
                         "retry_after", "finished", "plugin", "version", "held")

_BY_CODE: Final[dict[str, type[BaseException]]] = {
    **{spec.code: cls for cls, spec in HTTP_ERRORS.items()},
    _RUN_FINISHED.code: E.NoWorkAvailableError,
}


def spec_for(exc: BaseException) -> ErrorSpec:
    """The :class:`ErrorSpec` of ``exc``: its nearest class in the table, refined on the instance."""
    for cls in type(exc).__mro__:
        spec = HTTP_ERRORS.get(cls)
        if spec is not None:
            refined = spec.refine(exc) if spec.refine is not None else None
            return refined or spec
    return ErrorSpec(500, "internal_error")


def error_fields(exc: BaseException) -> dict[str, Any]:
    """JSON-able context attributes of ``exc`` (see :data:`CONTEXT_FIELDS`)."""
    out: dict[str, Any] = {}
    for name in CONTEXT_FIELDS:
        value = getattr(exc, name, None)
        if isinstance(value, (str, int, float, bool)):
            out[name] = value
    return out


def error_from_body(status: int, body: Mapping[str, Any]) -> E.VCAsyncError:
    """Rebuild the exception a server answered with; unknown codes become :class:`VCAsyncError`."""
    code = str(body.get("error", ""))
    message = str(body.get("message", f"HTTP {status}"))
    cls = _BY_CODE.get(code)
    if cls is None or not issubclass(cls, E.VCAsyncError):
        return E.VCAsyncError(f"HTTP {status} {code or 'error'}: {message}")
    params = inspect.signature(cls.__init__).parameters
    kwargs = {k: v for k, v in body.items()
              if k in CONTEXT_FIELDS and k in params and params[k].kind is inspect.Parameter.KEYWORD_ONLY}
    if cls is E.PluginValidationError:  # its message is prefixed again by the constructor
        kwargs.setdefault("plugin", "?")
    exc = cls(message, **kwargs)
    for k, v in body.items():  # context the constructor does not take (e.g. LedgerError on a subclass)
        if k in CONTEXT_FIELDS and not hasattr(exc, k):
            setattr(exc, k, v)
    return exc
