"""``vcasync worker``: train units for a coordinator until the run is finished.

The join credential comes from ``VCASYNC_JOIN_SECRET`` or ``VCASYNC_JOIN_TOKEN`` (or
``--join-secret-file``), never from a flag value. SIGTERM is the preemption notice: the worker stops at
the next step, saves within ``--grace-period`` seconds and exits 0; restarted with the same
``--state-dir`` it resumes the same lease while it is valid.

``--state URL`` (``file://``, ``s3://``, ``gs://``; ``memory://`` in tests) keeps identity, lease and
checkpoints in storage instead, so a replacement on *another machine* with the same URL resumes the
lease from its last checkpoint; ``--state-dir`` is then an optional local cache. A second live worker
on one state URL exits with the CONFIG status (the state is leased to the first).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import os
import sys
from pathlib import Path

from .. import _early_signals
from ..cli import Command, read_join_credential
from ..errors import ConfigError
from ..storage import outlives_process, shown_url

log = logging.getLogger("vcasync.cli")


def _configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--coordinator", required=True,
                   help="the coordinator's URL, http(s)://host:port (a path if a proxy mounts it under one)")
    p.add_argument("--trainer", required=True,
                   help="trainer 'pkg.mod:fn' (e.g. vcasync.examples.digits:train)")
    p.add_argument("--state-dir", type=Path,
                   help="local dir for identity, lease and checkpoints (with --state: a local cache)")
    p.add_argument("--state", metavar="URL",
                   help="keep identity, lease and checkpoints in storage (file://, s3://, gs://) so a "
                        "replacement machine resumes them")
    p.add_argument("--state-lease", type=float, metavar="SECONDS",
                   help="with --state: how long a silent owner keeps the state from a replacement "
                        "(default 30, at least 3; renewed every third of it)")
    p.add_argument("--keep-checkpoints", type=int,
                   help="with --state: checkpoints kept per lease (default 2)")
    p.add_argument("--allow-unsafe-store", action="store_true",
                   help="with --state: run (with a loud warning) on a store that ignores conditional "
                        "writes, instead of refusing it")
    p.add_argument("--name", default="", help="a human-readable worker name")
    p.add_argument("--grace-period", type=float, default=20.0,
                   help="seconds to wrap up after SIGTERM (default 20, at most a day)")
    p.add_argument("--give-up-after", type=float, default=3600.0, metavar="SECONDS",
                   help="exit with an error once the coordinator has been unreachable this long without a "
                        "break (default 3600; inf: never); the lease and checkpoints stay for a restart. "
                        "Unreachable after saying the run is finished: exit 0 at once, also in a "
                        "restart on the same state (its identity remembers it)")
    p.add_argument("--on-preempt", choices=["checkpoint", "partial"], default="checkpoint")
    p.add_argument("--upload", choices=["delta", "weights"], default="delta")
    p.add_argument("--codec", default="raw", help="wire codec for results (raw, zstd, ...)")
    p.add_argument("--max-units", type=int, metavar="N",
                   help="take at most N units, then exit: every lease taken counts, a new one or one "
                        "resumed from the state, whatever came of it (delivered, failed, handed "
                        "back); exit 1 if its trainer failed every one")
    p.add_argument("--ca-file", type=Path, help="CA certificate to verify an https coordinator")
    p.add_argument("--threads", type=int,
                   help="torch.set_num_threads for the trainer (1 to 1024, or this machine's CPUs "
                        "if more)")
    p.add_argument("--app-dir", type=Path, default=Path("."),
                   help="put this directory on sys.path to find the trainer (default: .)")
    p.add_argument("--join-secret-file", type=Path)
    p.add_argument("--no-uvloop", action="store_true")
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = EPILOG


#: The part of ``vcasync worker --help`` after the flags (docs/leases.md has the long form).
EPILOG = """\
exit status: 0 the run is finished (410 run_finished at a lease, a join or a heartbeat, also
  when the coordinator is gone by the time the worker asks again; or the worker was preempted:
  SIGTERM, SIGINT, also while it starts; or it took its --max-units), 1 error: also a trainer that
  failed 3 units in a row, or every unit it got before the run finished or its --max-units were
  taken (no result delivered), a trainer returning no result
  (its lease is handed back first), a quarantine, --give-up-after (a coordinator that had not said
  the run is finished), 2 configuration error (a refused join credential,
  a coordinator certificate that does not verify: --ca-file, --state held by another live
  worker), 4 --state storage failed
"""


def max_threads() -> int:
    """The most ``--threads`` a worker takes: past the machine's CPUs threads only take turns, and
    far past them the trainer's first step cannot start them all."""
    return max(1024, os.cpu_count() or 1)


def _run(a: argparse.Namespace) -> int:
    from .. import _owner_lease
    from .._imports import import_object
    from .._loop import run
    from .._paths import check_ca_file
    from ..worker import Worker, WorkerConfig
    from ..worker._client import check_coordinator_url

    check_coordinator_url(a.coordinator)
    note = check_ca_file(a.ca_file, str(a.coordinator))
    if note is not None:
        log.warning("%s", note)
    # Flags that only mean something for a state in storage: given beside --state-dir alone they
    # were dropped without a word, and a user believed a replacement machine would resume after
    # 10 s (--state-lease 10) or that a store ignoring preconditions had been allowed
    only_remote = [flag for flag, value in (("--state-lease", a.state_lease),
                                            ("--keep-checkpoints", a.keep_checkpoints),
                                            ("--allow-unsafe-store", a.allow_unsafe_store or None))
                   if value is not None]
    a.state_lease = 30.0 if a.state_lease is None else a.state_lease
    a.keep_checkpoints = 2 if a.keep_checkpoints is None else a.keep_checkpoints
    # nan passed the "<= 0" check and failed on SIGTERM ("cannot convert float NaN to integer")
    for flag, seconds in (("--grace-period", a.grace_period), ("--state-lease", a.state_lease)):
        if not (math.isfinite(seconds) and seconds > 0):
            raise ConfigError(f"{flag} must be a finite number of seconds > 0, got {seconds}")
    if a.grace_period > _owner_lease.MAX_TTL_S:     # 1e300 was taken
        raise ConfigError(f"--grace-period must be at most {_owner_lease.MAX_TTL_S:g} seconds (a "
                          f"day), got {a.grace_period}")
    if a.state_lease < _owner_lease.MIN_TTL_S:
        raise ConfigError(f"--state-lease must be at least {_owner_lease.MIN_TTL_S:g} seconds (the "
                          "state is renewed every third of it, each renewal several storage round "
                          f"trips), got {a.state_lease}")
    if a.state_lease > _owner_lease.MAX_TTL_S:
        raise ConfigError(f"--state-lease must be at most {_owner_lease.MAX_TTL_S:g} seconds (a day: "
                          "a replacement machine waits up to this long for a dead worker's state), "
                          f"got {a.state_lease}")
    if not a.give_up_after > 0:     # NaN too
        raise ConfigError(f"--give-up-after must be a number of seconds > 0 (inf: never), "
                          f"got {a.give_up_after}")
    if a.state_dir is None and a.state is None:
        raise ConfigError("give --state-dir DIR (local state) or --state URL (state in storage)")
    for flag, count in (("--max-units", a.max_units), ("--keep-checkpoints", a.keep_checkpoints)):
        if count is not None and count < 1:     # named as the flag, not WorkerConfig's field
            raise ConfigError(f"{flag} must be >= 1, got {count}")
    if a.state is None and only_remote:
        raise ConfigError(f"{' and '.join(only_remote)} only apply to a state in storage: give "
                          "--state URL, or leave them out with --state-dir alone")
    if a.state is not None and not outlives_process(a.state):
        log.warning("--state %s lives in this process: a worker started again (here or on another "
                    "machine) will not find its identity, lease or checkpoints there (for a state "
                    "that resumes: s3://, gs:// or file://)", shown_url(a.state))
    if a.threads is not None and a.threads < 1:
        raise ConfigError(f"--threads must be >= 1, got {a.threads}")
    if a.threads is not None and a.threads > max_threads():
        # --threads 100000 was taken: torch started its threads at the first step, the worker
        # crashed on "can't start new thread" (a traceback, exit 134) with its state dir made
        raise ConfigError(f"--threads must be at most {max_threads()} (torch threads for the "
                          f"trainer; this machine has {os.cpu_count() or 1} CPUs), got {a.threads}")
    secret, token = read_join_credential(a.join_secret_file)
    trainer = import_object(a.trainer, what="trainer", app_dir=a.app_dir)
    if a.threads is not None:
        import torch

        torch.set_num_threads(a.threads)
    config = WorkerConfig(name=a.name, grace_period_s=a.grace_period, on_preempt=a.on_preempt,
                          upload=a.upload, codec=a.codec, max_units=a.max_units, ca_file=a.ca_file,
                          keep_checkpoints=a.keep_checkpoints, state_lease_s=a.state_lease,
                          allow_unsafe_store=a.allow_unsafe_store, give_up_after_s=a.give_up_after)
    worker = Worker(a.coordinator, trainer, state_dir=a.state_dir, state=a.state, join_secret=secret,
                    join_token=token, config=config)

    async def main() -> int:
        # a SIGTERM since the command started (importing torch, the trainer) stops it now
        _early_signals.handover(asyncio.get_running_loop(), worker.request_stop)
        report = await worker.run()
        log.info("worker %s done (%s): %d accepted, %d refused, %d abandoned",
                 report.worker_id or "(never joined)", report.reason, report.results_accepted,
                 report.results_refused, report.units_abandoned)
        if report.grace_exceeded:
            # The trainer ignored the stop and is still running in its thread: leave now, the lease
            # and the trainer's last checkpoint are in the state dir.
            logging.shutdown()
            sys.stdout.flush()
            os._exit(0)
        return 0

    return run(main(), use_uvloop=False if a.no_uvloop else None)


COMMAND = Command(name="worker", help="train units for a coordinator (preemptible; resumes after restart)",
                  configure=_configure, run=_run, handles_signals=True)
