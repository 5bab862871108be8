"""The run record ``<prefix>/run``: a run's id, its lease-signing secret and its identity.

Written once when a run starts and read by every later start, **read before any attempt to create
it**: on a store that does not honour if-absent writes, create-first would overwrite the record at
every restart, and a new secret refuses every lease issued before the restart ("never issued here").
Before anything is written the store is probed (:func:`vcasync.storage.probe_storage`); a store that
ignores preconditions is refused unless the caller allows it, and then it is warned about loudly.

A start whose :class:`~vcasync.coordinator._identity.RunIdentity` differs from the recorded one is
refused with a :class:`ConfigError` that lists each difference and says how to start a new run (a
record without a model origin, from an older build, takes the start's: see :mod:`._identity`); a
different policy is accepted only with ``reset_policy`` (the coordinator then resets the policy state
and records the new identity with :func:`write_record`). A policy imported by ``module:Class`` is
recorded with that reference; a start that imports another reference for the same policy name is
warned about, not refused, and its reference is recorded.
"""

from __future__ import annotations

import contextlib
import json
import logging
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from .._paths import chmod_command, readable_by_others
from ..errors import ConfigError, CorruptObjectError, ObjectNotFoundError, PreconditionFailedError
from ..storage import Storage, probe_storage
from ._identity import RunIdentity

__all__ = ["FORMAT", "OWNER", "RunRecord", "StartOptions", "check_store", "exposed_record", "open_run",
           "write_record"]

FORMAT = 1
#: Under the state prefix: the owner records of the run's one live coordinator (vcasync._owner_lease).
OWNER = "owner/"
log = logging.getLogger("vcasync.coordinator")

NEW_RUN_HINT = ("to resume this run, start with its configuration; to start a new run, use another "
                "storage prefix (the storage URL or [coordinator] state_prefix) or pass --new-run "
                "(StartOptions(new_run=True)), which deletes this run's state")


@dataclass(frozen=True, slots=True)
class StartOptions:
    """One-shot choices for a single start (never kept in run.toml, where they would repeat)."""

    #: Delete whatever run is stored under the state prefix and start a new one.
    new_run: bool = False
    #: Accept a different policy (or parameters): the journal is replayed with the run's policy,
    #: then the new policy starts from a fresh state on the recovered model.
    reset_policy: bool = False
    #: Run on a store that ignores if-absent writes (with a loud warning) instead of refusing.
    allow_unsafe_store: bool = False

    def __post_init__(self) -> None:
        if self.new_run and self.reset_policy:
            # both were taken: the stored run was deleted and --reset-policy meant nothing
            raise ConfigError("--new-run (StartOptions(new_run=True)) deletes the stored run and "
                              "starts a new one with the policy given, so --reset-policy "
                              "(reset_policy=True), which switches a stored run to another policy, "
                              "means nothing beside it: give one of the two")


@dataclass(frozen=True, slots=True)
class RunRecord:
    run_id: str
    secret: bytes
    #: What the run was recorded with; None for a run this start created (it is ``wanted`` then).
    recorded: RunIdentity | None
    created: bool
    #: This start wrote under the prefix: it created the record, recorded its identity in one
    #: without, or deleted the stored run (``--new-run``).
    wrote: bool = False


def _encode(run_id: str, secret: bytes, identity: RunIdentity | None) -> bytes:
    return json.dumps({"format": FORMAT, "run_id": run_id, "secret": secret.hex(),
                       "identity": None if identity is None else identity.to_json()}).encode()


def _decode(key: str, raw: bytes) -> tuple[str, bytes, RunIdentity | None]:
    def refused(why: str) -> CorruptObjectError:
        return CorruptObjectError(f"{key}: not a vcasync run record ({why})", key=key)

    try:
        data: Any = json.loads(raw)
    except ValueError as exc:
        raise refused(f"not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise refused(f"a JSON {type(data).__name__}, not an object")
    found = data.get("format", FORMAT)
    if type(found) is not int or found != FORMAT:
        # a later build's record may mean something else by the same fields: resuming it on a
        # guess (as before 2026-12-07) could serve its run with the wrong secret or identity
        raise CorruptObjectError(f"{key}: run record format {repr(found)[:40]}, and this vcasync "
                                 f"reads format {FORMAT} only: start the run with the vcasync that "
                                 f"wrote it, or start a new run (--new-run, or another "
                                 f"state_prefix)", key=key)
    # each problem named plainly (it used to say "KeyError('run_id')"); the secret is never shown
    missing = [name for name in ("run_id", "secret") if name not in data]
    if missing:
        raise refused(f"it has no {' and no '.join(repr(name) for name in missing)} field")
    run_id, secret = data["run_id"], data["secret"]
    if not isinstance(run_id, str) or not run_id:
        raise refused(f"its 'run_id' is {repr(run_id)[:40]}, not a non-empty string")
    try:
        key_bytes = bytes.fromhex(secret) if isinstance(secret, str) else None
    except ValueError:
        key_bytes = None
    if not key_bytes:
        raise refused("its 'secret' is not a non-empty hexadecimal string")
    identity = data.get("identity")
    try:
        return run_id, key_bytes, None if identity is None else RunIdentity.from_json(identity)
    except KeyError as exc:
        raise refused(f"its 'identity' has no {exc.args[0]!r} field") from None
    except (ValueError, TypeError, AttributeError) as exc:
        raise refused(f"its 'identity' is unreadable: {exc}") from None


def exposed_record(storage: Storage, prefix: str) -> tuple[str, str] | None:
    """On a ``file://`` store, ``(path, chmod command)`` when the run record ``<prefix>/run``, which
    holds the secret that signs the run's leases, is a file other local users may read (its mode has
    group or other bits: a build before 2026-12-07 wrote it ``0644``; the store writes ``0600``);
    None when it is its owner's only, absent, or the store is not ``file://``. A root directory
    of another mode is left alone: the secret's own mode is what keeps it (see docs/storage.md)."""
    url = storage.url
    if not url.startswith("file://"):
        return None
    path = Path(unquote(urlsplit(url).path)).joinpath(*f"{prefix}/run".split("/"))
    mode = readable_by_others(path)
    if mode is None:
        return None
    return f"{path} (mode {mode:04o})", chmod_command(path, 0o600)


async def check_store(storage: Storage, prefix: str, allow_unsafe: bool) -> None:
    """Probe the store; refuse one that ignores if-absent writes unless ``allow_unsafe``."""
    probe = await probe_storage(storage, prefix)
    if probe.conditional_writes:
        return
    what = (f"{probe.url} does not honour conditional writes (a second if-absent write of one key "
            "succeeded), so a restart or a second coordinator on this prefix could overwrite the "
            "run record and journal")
    if not allow_unsafe:
        raise ConfigError(f"{what}; use a store that honours them (see docs/runs.md) or pass "
                          "--allow-unsafe-store (StartOptions(allow_unsafe_store=True)) to run "
                          "anyway, one coordinator at a time")
    log.warning("UNSAFE STORE: %s. Running anyway (--allow-unsafe-store): never start two "
                "coordinators on this prefix.", what)


async def _wipe(storage: Storage, prefix: str, record_key: str) -> int:
    """Delete the stored run (the record last: an interrupted wipe still looks like a run), all but
    the owner records: the start that wipes holds the lease they make."""
    owner = f"{prefix}/{OWNER}"
    keys = [k async for k in storage.list(f"{prefix}/") if k != record_key and not k.startswith(owner)]
    for key in keys:
        with contextlib.suppress(ObjectNotFoundError):
            await storage.delete(key)
    await storage.delete(record_key)
    return len(keys)


async def write_record(storage: Storage, key: str, run_id: str, secret: bytes,
                       identity: RunIdentity) -> None:
    """Replace the record's identity (same run id and secret: leases stay valid)."""
    await storage.put(key, _encode(run_id, secret, identity))


async def open_run(storage: Storage, prefix: str, wanted: RunIdentity | None,
                   options: StartOptions, *, probe: bool = True) -> RunRecord:
    """Probe the store (unless the caller did: ``probe`` False), then read the run record (creating
    it only when there is none).

    ``wanted`` None (tools that inspect a stored run, such as the chaos audit) compares nothing.
    """
    key = f"{prefix}/run"
    if probe:
        await check_store(storage, prefix, options.allow_unsafe_store)
    if options.new_run:
        deleted = await _wipe(storage, prefix, key)
        log.warning("--new-run: deleted the run stored under %r on %s (%d objects)", prefix,
                    storage.url, deleted)
    try:
        run_id, secret, recorded = _decode(key, await storage.get(key))
        created = False
    except ObjectNotFoundError:
        run_id, secret, recorded = secrets.token_hex(8), secrets.token_bytes(32), None
        try:
            await storage.put(key, _encode(run_id, secret, wanted), if_absent=True)
            created = True
        except PreconditionFailedError:     # another start won the race (or our first try did)
            run_id, secret, recorded = _decode(key, await storage.get(key))
            created = False
    wiped = options.new_run
    if created or wanted is None:
        return RunRecord(run_id, secret, recorded, created, wrote=created or wiped)
    if recorded is None:                    # a run from before identities were recorded: adopt
        log.info("run %s has no recorded identity; recording this start's", run_id)
        await write_record(storage, key, run_id, secret, wanted)
        return RunRecord(run_id, secret, wanted, False, wrote=True)
    differences = recorded.differences(wanted)
    if options.reset_policy:
        differences = [d for d in differences if not d.startswith("policy:")]
    if differences:
        raise ConfigError(f"the storage under {prefix!r} on {storage.url} holds run {run_id}, "
                          f"which this start does not match:\n  " + "\n  ".join(differences)
                          + f"\n{NEW_RUN_HINT}"
                          + ("" if recorded.same_policy(wanted) or options.reset_policy else
                             "; to switch this run to the new policy (its state starts afresh), "
                             "pass --reset-policy"))
    known = recorded.with_origin_of(wanted)
    if known != recorded:                   # recorded without (part of) the origin: record it now
        log.info("run %s has no recorded model origin; recording this start's", run_id)
    if recorded.statistics is None and wanted.statistics:   # recorded before the rule
        log.info("run %s has no recorded running statistics; recording this start's (%s)", run_id,
                 ", ".join(wanted.statistics))
    known = known.with_statistics_of(wanted)
    if known.with_params_of(wanted) != known:       # a parameter added to the policy since
        log.info("run %s has no recorded value for policy parameter(s) %s; recording this start's",
                 run_id, ", ".join(sorted((wanted.policy_params or {}).keys()
                                          - (recorded.policy_params or {}).keys())))
    known = known.with_params_of(wanted)
    if recorded.policy_ref is not None and wanted.policy_ref is not None \
            and recorded.policy_ref != wanted.policy_ref and recorded.same_policy(wanted):
        # the class may have been edited or moved between restarts: not refused, but never silent
        log.warning("run %s was started with policy %r from %r; this start imports %r from %r, "
                    "another class of the same name, and continues the run with it (if that is "
                    "not the run's policy, stop now and start with --policy %s)", run_id,
                    recorded.policy, recorded.policy_ref, wanted.policy, wanted.policy_ref,
                    recorded.policy_ref)
    known = known.with_policy_ref_of(wanted)
    if known != recorded:
        await write_record(storage, key, run_id, secret, known)
        return RunRecord(run_id, secret, known, False, wrote=True)
    return RunRecord(run_id, secret, recorded, False, wrote=wiped)
