"""``vcasync coordinator``: serve a training run over HTTP(S) until it is finished or stopped.

The storage URL forms and their options, credentials, what happens when storage fails mid-run and
the exit statuses are in ``--help`` (:data:`EPILOG`) and docs/storage.md.

Secrets come from the environment or files, never from flag values (visible to anyone via ``ps``):

* ``VCASYNC_JOIN_SECRET`` (or ``--join-secret-file``): the shared secret workers join with;
* ``VCASYNC_JOIN_TOKENS`` (``name=token,name=token``) or ``--join-tokens-file`` (``name token`` per
  line): pre-issued join tokens, each bound to one worker name;
* ``VCASYNC_OPERATOR_TOKEN`` (or ``--operator-token-file``): optional; enables operator routes such
  as ``vcasync requeue`` (parked units). Workers never hold it.
* ``VCASYNC_STATUS_TOKEN`` (or ``--status-token-file``): optional; the read token of the live status
  page (``/status/``) for browsers that are not on loopback (docs/status-page.md).

The same command resumes a run stored under the storage prefix; a start whose model, units or
policy differ is refused (exit 2) with what differs, and a finished run exits at once with its
result. ``--new-run``, ``--reset-policy`` and ``--allow-unsafe-store`` are one-shot choices for one
start (see docs/runs.md), so they are flags only, never run.toml keys.

Exit status (:class:`vcasync.cli.ExitCode`): ``OK`` when every unit was merged, ``PARKED`` when the
run ended with parked units (each is logged at ERROR with its last failure).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import functools
import logging
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from .. import _early_signals
from .._paths import check_output_file
from ..cli import Command, ExitCode, read_join_secret, read_secret
from ..coerce import parsed_or_word
from ..errors import ClosedError, ConfigError
from ._policy_ref import is_policy_ref, resolve_policy_name

if TYPE_CHECKING:
    import torch

    from ..coordinator import Coordinator, StartOptions
    from ..policy import MergePolicy
    from ..runconfig import RunConfig
    from ..server import Listener
    from ..server.status import StatusAccess
    from ..storage import Storage

log = logging.getLogger("vcasync.cli")


class ServeHooks(Protocol):
    """What a test-only entry point may wrap around the coordinator's policy and storage.

    The repository's chaos tests pass one (``harness.hooks.ChaosHooks``, in the source checkout and
    never in the installed package); the ``vcasync coordinator`` command passes none.
    """

    def wrap_policy(self, policy: MergePolicy) -> MergePolicy: ...

    def wrap_storage(self, storage: Storage, state_prefix: str) -> Storage: ...


def _configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", type=Path, help="run.toml (flags override it)")
    p.add_argument("--model", help="model factory 'pkg.mod:fn' returning an nn.Module")
    p.add_argument("--seed", type=int, help="torch seed before the factory runs, in [0, 2**32) (default 0); "
                   "recorded with the run, as --model is: another one is another run")
    p.add_argument("--shards", type=int)
    p.add_argument("--epochs", type=int)
    p.add_argument("--steps", type=int, help="local steps per unit")
    p.add_argument("--units", type=int, dest="count", help="total units (overrides --epochs)")
    p.add_argument("--unit-param", action="append", default=[], metavar="KEY=VALUE",
                   help="a trainer parameter for every unit (repeatable; values parsed as TOML, "
                        "a bare word as a string)")
    p.add_argument("--policy", help="merge policy: an installed one's name (default vcasgd; listed "
                                     "below) or 'module:Class' of your own, found as --model is")
    p.add_argument("--policy-param", action="append", default=[], metavar="KEY=VALUE",
                   help="a policy parameter (repeatable; values parsed as TOML, a bare word as a string)")
    p.add_argument("--storage", metavar="URL",
                   help="where the run's state lives: file:///path (default ./vcasync-run), "
                        "s3://bucket/prefix, gs://bucket/prefix, memory://name; options and "
                        "credentials below")
    p.add_argument("--durability", choices=["journal", "snapshot", "none"])
    p.add_argument("--lease-timeout", type=float, dest="lease_timeout_s")
    p.add_argument("--host")
    p.add_argument("--port", type=int)
    p.add_argument("--tls-cert", type=Path)
    p.add_argument("--tls-key", type=Path)
    p.add_argument("--linger", type=float, dest="linger_s",
                   help="seconds to keep serving after the run is finished, so that workers hear it "
                        "and exit (default 10); no wait told to a worker is longer than half of it "
                        "(never under 1 s)")
    p.add_argument("--output", type=Path,
                   help="write the final weights here (torch.save of a state dict) as soon as the run "
                        "finishes; not written when it is stopped before; its directory must exist")
    p.add_argument("--port-file", type=Path,
                   help="write the bound URL here once listening (removed when it stops listening, "
                        "and at start-up when it names a URL where nothing listens, as a killed "
                        "coordinator leaves it); its directory must exist, and an existing file "
                        "must hold a URL or nothing")
    p.add_argument("--app-dir", type=Path, default=Path("."),
                   help="put this directory on sys.path to find the model factory and a "
                        "'module:Class' policy (default: .)")
    p.add_argument("--join-secret-file", type=Path)
    p.add_argument("--join-tokens-file", type=Path)
    p.add_argument("--operator-token-file", type=Path,
                   help="file holding the operator token (or VCASYNC_OPERATOR_TOKEN)")
    p.add_argument("--status-token-file", type=Path,
                   help="file holding the status page's read token (else VCASYNC_STATUS_TOKEN); "
                        "without one, /status/ shows data to loopback only")
    p.add_argument("--status-no-loopback", action="store_true",
                   help="ask for the status read token on loopback too (behind a reverse proxy on "
                        "this host)")
    p.add_argument("--no-uvloop", action="store_true",
                   help="run on plain asyncio even if uvloop is installed")
    start = p.add_argument_group("one start only (see docs/runs.md)")
    start.add_argument("--new-run", action="store_true",
                       help="delete the run stored under the storage prefix and start a new one")
    start.add_argument("--reset-policy", action="store_true",
                       help="continue the stored run with a different policy or parameters; the "
                            "policy state starts afresh")
    start.add_argument("--allow-unsafe-store", action="store_true",
                       help="run (with a loud warning) on a store that ignores conditional "
                            "writes, instead of refusing it")

    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = installed_help() + "\n" + EPILOG


def installed_help() -> str:
    """The policies and storage schemes installed here, from their registries: a policy or backend
    a plugin package registers shows up in ``--help`` as soon as it is installed. A policy that
    cannot load (it fails validation, or its package does not import) is listed apart, as broken:
    under "installed", an operator would pick it and be refused at start. So is a storage scheme
    whose backend cannot load."""
    from ._help_text import wrap_list

    usable, broken = _policies_by_health()
    schemes, broken_schemes = _backends_by_health()
    return (wrap_list("merge policies installed (--policy, [policy] name):", usable)
            + (wrap_list("merge policies that cannot load (--policy NAME says why):", broken)
               if broken else "")
            + wrap_list("storage schemes installed (--storage, [storage] url):",
                        [f"{s}://" for s in schemes])
            + (wrap_list("storage schemes that cannot load (--storage URL says why):",
                         [f"{s}://" for s in broken_schemes]) if broken_schemes else ""))


def _policies_by_health() -> tuple[list[str], list[str]]:
    """The registered policy names that load and validate, and those that do not."""
    from ..policy import available_policies, policy_spec

    usable: list[str] = []
    broken: list[str] = []
    for name in available_policies():
        try:
            policy_spec(name)
        except Exception:   # any failure of a plugin's import: --help must still print
            broken.append(name)
        else:
            usable.append(name)
    return usable, broken


def _backends_by_health() -> tuple[list[str], list[str]]:
    """The URL schemes whose backend loads, and those whose backend does not (its package or a
    dependency missing, its import failing, two packages declaring the scheme)."""
    from ..storage import _BACKENDS as registry

    usable: list[str] = []
    broken: list[str] = []
    for scheme in registry.names():
        try:
            registry.get(scheme)
        except Exception:   # any failure of a plugin's import: --help must still print
            broken.append(scheme)
        else:
            usable.append(scheme)
    return usable, broken


#: The part of ``vcasync coordinator --help`` after the flags (docs/storage.md has the long form).
EPILOG = """\
storage URLs (--storage, or [storage] url in run.toml):
  file:///var/lib/vcasync/run1    a directory on this machine (a plain path works too)
  memory://name                   this process only, gone when it exits (tests, trials)
  s3://bucket/prefix              Amazon S3, or an S3-compatible store with
                                  ?endpoint_url=http://host:9000 (MinIO, R2, moto);
                                  also ?region=, ?profile=, ?addressing_style=path
  gs://bucket/prefix              Google Cloud Storage, or an emulator with
                                  ?emulator_host=host:port (or STORAGE_EMULATOR_HOST=host:port)

credentials (from the environment or files, never in the URL or a flag):
  s3://  the AWS chain: AWS_ACCESS_KEY_ID + AWS_SECRET_ACCESS_KEY (+ AWS_SESSION_TOKEN),
         AWS_PROFILE / ?profile=, ~/.aws/config and credentials, SSO, instance metadata
  gs://  GOOGLE_APPLICATION_CREDENTIALS (a service-account JSON) or ?service_file=PATH,
         gcloud application-default credentials, the metadata server; none for an emulator
  workers join with VCASYNC_JOIN_SECRET or --join-secret-file (or VCASYNC_JOIN_TOKENS /
  --join-tokens-file: "name token" per line)

live status page: http://HOST:PORT/status/ (read-only; the address is logged at start)
  open to browsers on loopback; elsewhere it asks for the read token from VCASYNC_STATUS_TOKEN
  or --status-token-file (16+ characters, not the join secret nor the operator token); open
  http://HOST:PORT/status/#token=TOKEN once to keep it for that browser tab

storage failing during a run:
  a write that results need fails -> storage "unavailable": workers are answered
  503 storage_unavailable with Retry-After and wait with their results; the coordinator logs
  an ERROR, shows it in /v1/status ("storage") and /metrics (vcasync_storage_state), and probes
  the storage (from 0.1s, backing off to [coordinator] storage_probe_interval_s, 5). Back: work
  goes on, nothing lost.
  Still unavailable after storage_outage_limit_s (600): it stops with exit status 4.

exit status: 0 run finished, 1 error, 2 configuration error, 3 finished with parked units,
  4 storage failed, 130 stopped (SIGTERM/SIGINT) before the run finished
"""


def _kv(items: list[str], what: str) -> dict[str, Any]:
    import tomllib

    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"{what} must look like KEY=VALUE, got {item!r}")
        out[key] = parsed_or_word(raw, lambda text: tomllib.loads(f"v = {text}")["v"], f"{what} {key}")
    return out


def _overrides(a: argparse.Namespace) -> dict[str, Any]:
    policy: dict[str, Any] = {"name": a.policy}
    if a.policy_param:
        policy["params"] = _kv(a.policy_param, "--policy-param")
    units: dict[str, Any] = {"shards": a.shards, "epochs": a.epochs, "steps": a.steps, "count": a.count}
    if a.unit_param:
        units["params"] = _kv(a.unit_param, "--unit-param")
    return {
        "model": {"factory": a.model, "seed": a.seed},
        "units": units,
        "policy": policy,
        "storage": {"url": a.storage},
        "coordinator": {"durability": a.durability, "lease_timeout_s": a.lease_timeout_s},
        "server": {"host": a.host, "port": a.port,
                   "tls_cert": str(a.tls_cert) if a.tls_cert else None,
                   "tls_key": str(a.tls_key) if a.tls_key else None},
        "run": {"linger_s": a.linger_s, "output": str(a.output) if a.output else None},
    }


def _join_tokens(file: Path | None) -> dict[str, str]:
    out: dict[str, str] = {}
    raw = os.environ.get("VCASYNC_JOIN_TOKENS", "")
    for item in filter(None, (s.strip() for s in raw.split(","))):
        name, sep, token = item.partition("=")
        if not sep or not name or not token:
            raise ConfigError("VCASYNC_JOIN_TOKENS must look like name=token,name=token")
        out[name] = token
    if file is not None:
        try:
            lines = file.read_text().splitlines()
        except OSError as exc:
            raise ConfigError(f"cannot read the join tokens file {file}: {exc}") from exc
        for n, line in enumerate(lines, 1):
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            parts = line.split()
            if len(parts) != 2:
                raise ConfigError(f"{file}:{n}: expected 'name token'")
            out[parts[0]] = parts[1]
    return out


def _run(a: argparse.Namespace) -> int:
    return launch(a)


def launch(a: argparse.Namespace, hooks: ServeHooks | None = None) -> int:
    """Run the coordinator the parsed arguments ``a`` describe, until it is finished or stopped.

    ``hooks`` come only from the repository's test-only entry point ``python -m harness.chaos_coordinator``:
    the production command passes none and reads no test switch from the environment, so no
    variable left set on a server can turn on pause points or injected storage faults.
    """
    from .._loop import run
    from ..runconfig import load_run_config

    if a.port_file is not None:         # first: importing the server (torch) alone takes seconds
        _clear_dead_port_file(a.port_file)
    cfg = load_run_config(a.config, _overrides(a))
    secret = read_join_secret(a.join_secret_file)
    tokens = _join_tokens(a.join_tokens_file)
    operator = read_secret("VCASYNC_OPERATOR_TOKEN", a.operator_token_file, what="operator token")
    status_access = _status_access(read_secret("VCASYNC_STATUS_TOKEN", a.status_token_file,
                                               what="status read token"),
                                   require=a.status_no_loopback,
                                   others=(secret, operator, *tokens.values()))
    if not secret and not tokens:
        raise ConfigError("no join credential: set VCASYNC_JOIN_SECRET (or --join-secret-file, "
                          "VCASYNC_JOIN_TOKENS, --join-tokens-file)")
    from ..server import check_join_tokens

    check_join_tokens(tokens, secret)     # before the storage is opened, as the secret's own checks
    from ..coordinator import StartOptions

    start = StartOptions(new_run=a.new_run, reset_policy=a.reset_policy,
                         allow_unsafe_store=a.allow_unsafe_store)
    return run(serve(cfg, secret, tokens, port_file=a.port_file, app_dir=a.app_dir, hooks=hooks,
                     operator_token=operator, start=start, status_access=status_access),
               use_uvloop=False if a.no_uvloop else None)


def _status_access(token: str | None, *, require: bool,
                   others: tuple[str | None, ...]) -> StatusAccess:
    """Who may read the status page; the read token must be none of the other credentials (a
    browser keeps it, and every worker holds the join secret)."""
    from ..server.status import StatusAccess

    if token is not None and token in others:
        raise ConfigError("the status read token must differ from the join secret, join tokens and "
                          "operator token")
    if require and token is None:
        raise ConfigError("--status-no-loopback needs a status read token: set "
                          "VCASYNC_STATUS_TOKEN or --status-token-file")
    return StatusAccess(token, open_on_loopback=not require)


def _policy_ref(cfg: RunConfig) -> str | None:
    """The ``module:Class`` the run's policy is imported from (recorded with the run, so that
    ``--reset-policy`` can import it again to switch away from it); None for an installed one."""
    name = cfg.policy.get("name") if isinstance(cfg.policy, dict) else None
    return name if is_policy_ref(name) and isinstance(name, str) else None


def _policy(cfg: RunConfig, app_dir: Path | None = None) -> tuple[MergePolicy, dict[str, Any]]:
    """The policy, and its parameters with defaults filled in (recorded with the run, so that
    naming a default explicitly is the same run and changing one is not). A ``module:Class`` name
    is imported from ``app_dir`` or ``sys.path`` and registered (:mod:`._policy_ref`)."""
    from .._params import coerce_params
    from ..policy import policy_from_config, policy_spec

    table = dict(cfg.policy)
    table["name"] = resolve_policy_name(table.get("name"), app_dir=app_dir)
    policy = policy_from_config({"policy": table})
    spec = policy_spec(policy.name)
    given = cfg.policy.get("params", {}) if isinstance(cfg.policy, dict) else {}
    return policy, {**spec.defaults(), **coerce_params(spec.name, spec.params, given or {})}


def build_module(ref: str, seed: int, *, app_dir: Path | None = None) -> torch.nn.Module:
    """The initial model: the factory ``ref`` names, called with torch seeded with ``seed``.

    The one place a model factory is called (``vcasync coordinator``, and the demo through it). Every
    way it can fail is a :class:`ConfigError` naming the factory (exit 2, nothing started): it cannot
    be imported, it raises (``model factory 'm:f' raised TypeError: ...``), or it returns no
    ``nn.Module``.
    """
    import torch

    from .._imports import import_object
    from ..errors import VCAsyncError

    factory = import_object(ref, what="model factory", app_dir=app_dir)
    torch.manual_seed(seed)
    try:
        module = factory()
    except VCAsyncError:
        raise                   # already says what is wrong
    except Exception as exc:    # a factory that needs arguments, or a bug in it: its message, one line
        raise ConfigError(f"model factory {ref!r} raised {type(exc).__name__}: {exc} (it is called "
                          "with no arguments and returns an nn.Module)") from exc
    if not isinstance(module, torch.nn.Module):
        raise ConfigError(f"model factory {ref!r} returned {type(module).__name__}, not an nn.Module")
    return module


async def serve(cfg: RunConfig, secret: str | None, tokens: dict[str, str], *,
                port_file: Path | None = None, app_dir: Path | None = None,
                hooks: ServeHooks | None = None, operator_token: str | None = None,
                start: StartOptions | None = None, status_access: StatusAccess | None = None) -> int:
    """Run the coordinator ``cfg`` describes until the run is finished (then ``linger_s``) or a signal.

    Returns :attr:`ExitCode.PARKED` when the run finished with parked units (an operator may requeue
    them while it lingers: the run then goes on), else :attr:`ExitCode.OK`.

    ``hooks`` (chaos tests only, see :class:`ServeHooks`) wraps the policy and the storage so
    a test can kill the process at a known step and inject storage faults; None adds nothing.
    """
    if cfg.output is not None:
        check_output_file(cfg.output, "run.output",
                          purpose=f"the final weights are written to {cfg.output} when the run finishes")
    if port_file is not None:
        check_output_file(port_file, "--port-file",
                          purpose=f"the coordinator's URL is written to {port_file} once it listens")

    from ..coordinator import Coordinator, CoordinatorConfig, first_non_finite
    from ..coordinator._args import unmergeable
    from ..runconfig import dataclass_from_table
    from ..server import listen
    from ..server._auth import StorageTokenStore, TokenAuthority
    from ..storage import open_storage, outlives_process, shown_url
    from ..tensors import ModelState

    # before the model is built: its settings are checked when made (heartbeat vs lease timeout)
    coord_cfg = dataclass_from_table(CoordinatorConfig, cfg.coordinator, "coordinator")
    # the factory's module is a temporary: copied into the state, it is not kept beside the
    # coordinator's own copies
    module = build_module(cfg.model, cfg.seed, app_dir=app_dir)
    # checked on the module's own tensors, before they are copied: a sparse or meta one cannot be
    why = unmergeable(module.state_dict())
    if why is not None:
        raise ConfigError(f"model factory {cfg.model!r} built a model whose {why} (nothing was "
                          "started)")
    model = ModelState.from_module(module)
    del module
    bad = first_non_finite(model.tensors)
    if bad is not None:     # named here: the Coordinator's own check knows no factory
        raise ConfigError(f"model factory {cfg.model!r} (seed {cfg.seed}) built an initial model whose "
                          f"tensor {bad!r} is not finite (NaN or inf): every worker's trainer would "
                          "fail on it; fix the factory's initialisation (nothing was started)")
    policy, policy_params = _policy(cfg, app_dir)
    units = cfg.units.build()
    output_failed: list[str] = []       # why the final weights could not be written, if so
    stop = asyncio.Event()
    # a SIGTERM since the command started (importing torch, building the model) sets it now
    _early_signals.handover(asyncio.get_running_loop(), stop.set)
    if stop.is_set():
        log.info("stopped before the storage was opened: nothing was changed")
        return ExitCode.INTERRUPTED
    if not outlives_process(cfg.storage):
        log.warning("storage %s lives in this process: the run's state is gone when it exits, and a "
                    "restarted coordinator starts the run over (for a run that resumes: a path, "
                    "file://, s3:// or gs://)", shown_url(cfg.storage))
    # Bound (and the TLS files loaded) before the storage is touched: a bad certificate, a host
    # that is not this machine's or a port in use was found once the run record, the first
    # snapshot and the owner lease were written, so an exit 2 ("nothing was changed") left a run
    # that the corrected start was then refused as not matching.
    async with listen(cfg.server) as listener, open_storage(cfg.storage) as storage:
        if hooks is not None:
            policy = hooks.wrap_policy(policy)
            storage = hooks.wrap_storage(storage, coord_cfg.state_prefix)
        # the run's tokens live with the run: --new-run (which deletes the prefix) revokes them
        # with it, and runs under other prefixes of one storage keep theirs. Durability none keeps
        # no run, so it keeps its tokens in memory: stored, they would outlive it and be accepted
        # by whichever run is started under that prefix later
        token_store = (StorageTokenStore(storage, f"{coord_cfg.state_prefix.strip('/')}/auth/tokens/")
                       if coord_cfg.durability != "none" else None)
        authority = TokenAuthority(join_secret=secret, join_tokens=tokens, store=token_store,
                                   operator_token=operator_token)
        # handed over (adopt_model): a new run merges into these tensors, not a copy of them
        coordinator = Coordinator(model, units, policy=policy, storage=storage, config=coord_cfg,
                                  policy_params=policy_params, start=start, adopt_model=True,
                                  model_origin={"factory": cfg.model, "seed": cfg.seed},
                                  policy_ref=_policy_ref(cfg),
                                  load_policy=functools.partial(resolve_policy_name,
                                                                app_dir=app_dir))
        del model      # the coordinator's now, let go of at start: keep none here
        async with coordinator as coord:
            if stop.is_set():
                # stopped while the storage was opened and the run loaded: closed as after serving
                # (the owner lease handed back), nothing served
                log.info("stopped while starting, at model v%d: not served", coord.version)
                finished = False
            elif coord.finished and not coord.parked() and not coord.took_over:
                status = coord.status()
                log.info("run %s is already finished at model v%d (units: %s); nothing to serve",
                         status.get("run_id"), coord.version, status.get("units"))
                _log_parked(coord.parked())
                problem = _write_output(cfg, coord)
                if problem is not None:
                    output_failed.append(problem)
                finished = True
            else:
                if coord.finished and not coord.parked():
                    # its coordinator died before its workers all heard the end (while lingering):
                    # they retry until they do, so serve linger_s, as the end of a served run does,
                    # but at least twice their reconnect delay: they are retrying an unreachable
                    # coordinator, not waiting on a hint the server capped
                    cfg = dataclasses.replace(cfg, linger_s=max(cfg.linger_s, _reconnect_linger()))
                    log.info("run %s is already finished at model v%d; its coordinator stopped "
                             "uncleanly, so serving %.0fs for its workers to hear it",
                             coord.status().get("run_id"), coord.version, cfg.linger_s)
                elif coord.finished:   # only parked units are left: serve, so they can be requeued
                    log.info("run %s ended with %d parked unit(s); serving %.0fs so an operator can "
                             "requeue them (vcasync requeue)", coord.status().get("run_id"),
                             len(coord.parked()), cfg.linger_s)
                finished = await _serve_until_done(cfg, coord, authority, port_file, stop,
                                                   f"{len(units)} units, policy {policy.name}",
                                                   status_access, listener, output_failed)
    code = _exit_code(coord, finished)
    if finished and output_failed and code in (ExitCode.OK, ExitCode.PARKED):
        log.error("exiting with status %d: %s", ExitCode.ERROR, output_failed[0])
        return ExitCode.ERROR
    return code


def _reconnect_linger() -> float:
    """How long a finished run taken over from a crash is served at least: twice the longest wait
    between a worker's retries of an unreachable coordinator (:data:`WORKER_BACKOFF`, full jitter),
    so every worker still retrying asks within it (a 3 s linger was missed by each of 4 workers
    retrying up to 10 s apart, which then retried for their --give-up-after)."""
    from ..worker._worker import WORKER_BACKOFF
    return 2 * WORKER_BACKOFF.max_delay_s


async def _serve_until_done(cfg: RunConfig, coord: Coordinator, authority: Any, port_file: Path | None,
                            stop: asyncio.Event, what: str,
                            status_access: StatusAccess | None = None,
                            listener: Listener | None = None,
                            output_failed: list[str] | None = None) -> bool:
    """Serve workers until the run is finished (then ``linger_s``, during which an operator may
    requeue parked units and the run goes on) or a signal; True if the run finished."""
    from ..server import CollectorGuard, Server
    from ..server._waits import linger_warning
    from ..server.status import StatusAccess

    warning = linger_warning(cfg.linger_s)
    if warning is not None:
        log.warning("%s", warning)
    # linger_s: every wait told to a worker is short enough that it asks again, hears the end of
    # the run and exits while the finished run is still served
    async with Server(coord, authority, cfg.server, status_access=status_access,
                      listener=listener, linger_s=cfg.linger_s) as server, \
            CollectorGuard():
        # The guard freezes what is allocated so far (torch, the model, the ledger) and what
        # outlives the collector's passes: unguarded, those passes stall the loop for 50-340 ms
        # once thousands of workers have joined (see vcasync.server._collector).
        log.info("coordinator listening on %s (run %s, model v%d, %s)",
                 server.url, coord.status().get("run_id"), coord.version, what)
        log.info("status page: %s (%s)", server.status_url,
                 (status_access or StatusAccess()).describe())
        if port_file is not None:
            tmp = port_file.with_name(port_file.name + ".tmp")
            tmp.write_text(server.url + "\n")
            tmp.replace(port_file)
        try:
            return await _serve_on(cfg, coord, stop, output_failed)
        finally:
            # no longer listening: a script waiting for the file (a restart on --port 0) must not
            # read this URL (unless another start wrote its own meanwhile)
            if port_file is not None:
                _remove_port_file(port_file, server.url)


#: What a port file this command writes holds: one http(s) URL. Anything else is not removed at
#: start-up (a --port-file pointed at another file by mistake once deleted it, and logged it).
_PORT_FILE_URL = re.compile(r"https?://[A-Za-z0-9.\-\[\]:]+/?")
MAX_PORT_FILE_BYTES = 512


def _clear_dead_port_file(port_file: Path) -> None:
    """Remove ``port_file`` when it holds the URL of a coordinator that no longer listens.

    A coordinator removes its file when it stops listening, but one SIGKILLed (or whose machine
    lost power) cannot: its dead URL stayed until the next start was listening, seconds later, and
    a script waiting for the file after the restart read it. A start calls this first, so the file
    is absent until the new URL replaces it. Only a regular file is removed (anything else is left
    for the --port-file check to refuse), and only when nothing accepts a connection at its URL: a
    live coordinator's file is not taken from it by a second start that will be refused. A file
    that holds anything but one http(s) URL (or nothing) is not one this command wrote: the start
    is refused (:class:`ConfigError`) rather than overwrite it once listening (a file given as
    --port-file by mistake was replaced, then removed at the stop), and its contents are never
    logged."""
    try:
        if not port_file.is_file():
            return
        big = port_file.stat().st_size > MAX_PORT_FILE_BYTES
        url = "" if big else port_file.read_text(errors="replace").strip()
    except OSError:
        return
    if big or (url and not _PORT_FILE_URL.fullmatch(url)):
        raise ConfigError(f"--port-file {port_file} exists and holds something other than a URL: "
                          "not a file this command wrote, so it is not overwritten; remove it or "
                          "name another path")
    if not url:
        return      # empty (made by mktemp, say): replaced once listening
    if _answers(url):
        log.info("--port-file %s holds %s, where something still listens: left until this "
                 "coordinator listens", port_file, url)
        return
    with contextlib.suppress(OSError):
        port_file.unlink()
        log.info("removed --port-file %s: it held %s, where no coordinator listens any more",
                 port_file, url or "nothing")


def _answers(url: str, timeout_s: float = 1.0) -> bool:
    """True when a TCP connection to ``url``'s host and port is accepted within ``timeout_s``."""
    import socket
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port
    except ValueError:
        return False
    if not host or parts.scheme not in ("http", "https"):
        return False
    try:
        with socket.create_connection((host, port or (443 if parts.scheme == "https" else 80)),
                                      timeout=timeout_s):
            return True
    except OSError:
        return False


def _remove_port_file(port_file: Path, url: str) -> None:
    """Remove ``port_file`` if it still holds ``url`` (a later start may have written its own)."""
    try:
        if port_file.read_text() == url + "\n":
            port_file.unlink()
    except OSError:
        pass


async def _serve_on(cfg: RunConfig, coord: Coordinator, stop: asyncio.Event,
                    output_failed: list[str] | None = None) -> bool:
    """Serve until the run is finished and lingered (or is stopped): True if it finished.
    ``output_failed`` gets why the final weights could not be written, if they could not."""
    from ..server._waits import MIN_WAIT_S

    finished = False
    try:
        while await _first(coord.wait_finished(), stop.wait()):
            finished = True
            _log_parked(coord.parked())
            problem = _write_output(cfg, coord)   # now: the weights are final, lingering changes nothing
            if output_failed is not None:     # a requeued run that finishes again writes them again
                output_failed[:] = [] if problem is None else [problem]
            # a linger too short to cap the waits told (--linger 0): at least until the workers told
            # "no work now, ask again" have asked (a longer one caps every wait at half of it)
            linger = cfg.linger_s if cfg.linger_s >= 2 * MIN_WAIT_S else max(cfg.linger_s,
                                                                            coord.answers_owed_s)
            log.info("run finished at model v%d; serving %.0fs more so workers hear it",
                     coord.version, linger)
            if not await _linger(coord, linger, stop):
                break
            finished = False
            log.info("parked units were requeued: the run goes on")
        if stop.is_set():
            finished = await _answer_owed(cfg, coord, finished, output_failed)
    except ClosedError:
        if coord.storage_error is None:
            raise
        return False     # storage gave out: said and logged by the coordinator
    if not finished and coord.storage_error is None:
        log.info("stopped before the run finished, at model v%d%s", coord.version,
                 f"; {cfg.output} not written (the weights are not final)"
                 if cfg.output is not None else "")
    return finished


async def _answer_owed(cfg: RunConfig, coord: Coordinator, finished: bool,
                       output_failed: list[str] | None) -> bool:
    """Stopped (a signal) once every unit is done: serve on until the workers told "the run is
    finishing" or "no work now" have asked again (:attr:`Coordinator.answers_owed_s`, bounded by
    what was owed at the stop), so they hear ``410 run_finished``. A stop within that second
    left them retrying an unreachable URL for their --give-up-after (an hour by default), and a
    restart did not help: a cleanly stopped finished run exits at once. A run still finishing
    (its last results merged and made durable) may finish meanwhile: its weights are written
    then. True if the run is finished."""
    owed = coord.answers_owed_s
    units = coord.status().get("units", {})
    if owed <= 0 or units.get("queued", 0) or units.get("leased", 0):
        return finished     # nobody to answer, or a run that goes on: a restart serves it
    log.info("stopping: serving up to %.1fs more so the workers told to ask again hear the run "
             "%s", owed, "ended" if finished else "ending")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + owed
    if not finished:
        finished = await _first(coord.wait_finished(), asyncio.sleep(owed))
        if finished:
            _log_parked(coord.parked())
            problem = _write_output(cfg, coord)
            if output_failed is not None:
                output_failed[:] = [] if problem is None else [problem]
    while (left := deadline - loop.time()) > 0:
        if coord.answers_owed_s <= 0:      # every worker told has asked again by now
            break
        await asyncio.sleep(min(0.2, left))
    return finished and coord.finished


def _write_output(cfg: RunConfig, coord: Coordinator) -> str | None:
    """``torch.save`` the final weights to ``--output`` atomically: a reader never sees half a file.

    Returns None, or why they could not be written (logged at ERROR): the coordinator goes on
    lingering so that its workers hear the run is finished, and exits 1 at the end. (The
    directory removed, a full disk or a permission taken away since the start crashed it with a
    traceback before it lingered: its workers, never told, retried for their --give-up-after.)"""
    import torch

    if cfg.output is None:
        return None
    tmp = cfg.output.with_name(f".{cfg.output.name}.tmp")
    try:
        torch.save(dict(coord.model().tensors), tmp)
        tmp.replace(cfg.output)
    except (OSError, RuntimeError) as exc:     # torch says RuntimeError for a missing directory
        with contextlib.suppress(OSError):
            tmp.unlink()
        problem = (f"the final weights (model v{coord.version}) could not be written to "
                   f"{cfg.output}: {type(exc).__name__}: {exc}; the run's storage keeps them: start "
                   "the coordinator again with a run.output (--output) it can write, and the "
                   "finished run writes it and exits")
        log.error("%s", problem)
        return problem
    log.info("final weights (model v%d) written to %s", coord.version, cfg.output)
    return None


def _log_parked(parked: dict[str, str]) -> None:
    for unit_id, why in parked.items():
        log.error("unit %s is parked and was not trained: %s", unit_id, why)
    if parked:
        log.error("%d unit(s) parked; requeue them with 'vcasync requeue' while the coordinator "
                  "lingers, or the run ends with exit code %d", len(parked), ExitCode.PARKED)


async def _linger(coord: Any, seconds: float, stop: asyncio.Event) -> bool:
    """Serve ``seconds`` more; True as soon as the run is no longer finished (units requeued)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while not stop.is_set() and (left := deadline - loop.time()) > 0:
        if not coord.finished:
            return True
        await _first(asyncio.sleep(min(0.2, left)), stop.wait())
    return not coord.finished and not stop.is_set()


def _exit_code(coord: Coordinator, finished: bool) -> ExitCode:
    """What the run's end means (see :class:`vcasync.cli.ExitCode`); the reason is logged here.
    One function for a run that finishes now and one found finished at start-up."""
    if coord.storage_error is not None:
        log.error("exiting with status %d: storage failed (%s)", ExitCode.STORAGE,
                  coord.storage_error)
        return ExitCode.STORAGE
    if not finished:
        return ExitCode.INTERRUPTED
    parked = coord.parked()
    if parked:
        log.error("run ended with %d parked unit(s), never merged: exit code %d (PARKED; see "
                  "/v1/status)", len(parked), ExitCode.PARKED)
        return ExitCode.PARKED
    return ExitCode.OK


async def _first(a: Any, b: Any) -> bool:
    """Await two coroutines until the first finishes (cancelling the other); True if ``a`` did."""
    ta, tb = asyncio.ensure_future(a), asyncio.ensure_future(b)
    try:
        done, _ = await asyncio.wait({ta, tb}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in (ta, tb):
            t.cancel()
        await asyncio.gather(ta, tb, return_exceptions=True)
    if ta in done:
        ta.result()
        return True
    return False


COMMAND = Command(name="coordinator", help="serve a training run to workers over HTTP(S)",
                  configure=_configure, run=_run, handles_signals=True)
