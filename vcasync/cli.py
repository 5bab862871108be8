"""The ``vcasync`` command: a registry of subcommands.

Each subcommand is a :class:`Command` named ``COMMAND`` in a module of :mod:`vcasync.commands`
(dropping a module there registers it), or an entry point in the ``vcasync.commands`` group (how
another package adds one). Heavy imports happen inside ``run`` so ``vcasync --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import pkgutil
import sys
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from . import _early_signals
from .errors import (
    BackendUnavailableError,
    ConfigError,
    RunIncompleteError,
    StorageError,
    UnknownPolicyError,
    VCAsyncError,
)
from .exit_codes import ExitCode

__all__ = ["ENVIRONMENT", "Command", "EnvVar", "ExitCode", "available_commands", "console",
           "environment_help", "join_credential_env", "main", "read_join_credential", "read_join_secret",
           "read_secret"]

log = logging.getLogger("vcasync.cli")


@dataclass(frozen=True, slots=True)
class EnvVar:
    """An environment variable a ``vcasync`` command reads: what it means and which commands read it."""

    meaning: str
    commands: tuple[str, ...]


_STORAGE_USERS = ("coordinator", "worker")

#: Every environment variable the commands read (directly, or through a storage backend's client).
#: Each command's ``--help`` lists its own (:func:`environment_help`); a test checks that every
#: variable the source reads is listed here. Secrets come from here or from files, never from flags.
ENVIRONMENT: Mapping[str, EnvVar] = {
    "VCASYNC_JOIN_SECRET": EnvVar(
        "the shared secret workers join with, at least 16 characters (or --join-secret-file); "
        "make one with: python -c 'import secrets; print(secrets.token_urlsafe(32))'",
        ("coordinator", "worker", "ray")),
    "VCASYNC_JOIN_TOKENS": EnvVar(
        "pre-issued join tokens, name=token,name=token, each bound to one worker name, at least 16 "
        "characters and not the join secret (or --join-tokens-file, 'name token' per line)",
        ("coordinator",)),
    "VCASYNC_JOIN_TOKEN": EnvVar("a worker's pre-issued join token, instead of the join secret "
                                 "(at least 16 characters)", ("worker", "ray")),
    "VCASYNC_OPERATOR_TOKEN": EnvVar(
        "optional operator token, at least 16 characters and different from every join credential "
        "(or --operator-token-file): enables operator routes such as requeue; workers never hold it",
        ("coordinator", "requeue")),
    "VCASYNC_STATUS_TOKEN": EnvVar(
        "optional read token of the live status page (/status/), at least 16 characters and different "
        "from every other credential (or --status-token-file): without one the page shows data to "
        "loopback only", ("coordinator",)),
    "AWS_ACCESS_KEY_ID": EnvVar("s3:// credentials, with AWS_SECRET_ACCESS_KEY (the AWS chain)",
                                _STORAGE_USERS),
    "AWS_SECRET_ACCESS_KEY": EnvVar("s3:// credentials, with AWS_ACCESS_KEY_ID", _STORAGE_USERS),
    "AWS_SESSION_TOKEN": EnvVar("s3:// temporary credentials' session token", _STORAGE_USERS),
    "AWS_PROFILE": EnvVar("s3:// profile of ~/.aws/config (or ?profile=)", _STORAGE_USERS),
    "GOOGLE_APPLICATION_CREDENTIALS": EnvVar("gs:// service-account JSON file (or ?service_file=)",
                                             _STORAGE_USERS),
    "STORAGE_EMULATOR_HOST": EnvVar("gs:// against a GCS emulator at host:port (or ?emulator_host=)",
                                    _STORAGE_USERS),
    "CLOUDSDK_CONFIG": EnvVar("gs:// where gcloud keeps its application-default credentials "
                              "(default ~/.config/gcloud)", _STORAGE_USERS),
    "APPDATA": EnvVar("gs:// on Windows: the folder holding gcloud's configuration", _STORAGE_USERS),
    "GCE_METADATA_HOST": EnvVar("gs:// the GCP metadata server to ask for credentials "
                                "(default metadata.google.internal)", _STORAGE_USERS),
    "GCE_METADATA_ROOT": EnvVar("gs:// the same, older name", _STORAGE_USERS),
}


def environment_help(command: str) -> str:
    """The ``environment:`` section of ``vcasync COMMAND --help``: the variables ``command`` reads."""
    rows = [(var, env.meaning) for var, env in sorted(ENVIRONMENT.items()) if command in env.commands]
    if not rows:
        return ""
    width = max(len(var) for var, _ in rows) + 2
    lines = ["environment variables:"]
    for var, meaning in rows:
        lines.extend(_wrap(f"  {var.ljust(width)}", meaning, " " * (width + 2)))
    return "\n".join(lines) + "\n"


def _wrap(first: str, text: str, indent: str, width: int = 96) -> list[str]:
    import textwrap

    return textwrap.wrap(text, width, initial_indent=first, subsequent_indent=indent,
                         break_on_hyphens=False, break_long_words=False) or [first]


@dataclass(frozen=True, slots=True)
class Command:
    """One subcommand: ``configure`` adds its arguments, ``run`` returns the exit status.

    ``handles_signals``: ``run`` stops cleanly on SIGTERM and SIGINT, which :func:`main` holds from
    its first moment (:mod:`vcasync._early_signals`): ``run`` hands them over to its event loop
    with ``_early_signals.handover``, which calls its stop at once for one that came during
    start-up. False: the default handling is given back before ``run``."""

    name: str
    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    handles_signals: bool = False


def _check(where: str, obj: object) -> Command:
    if not isinstance(obj, Command):
        raise ConfigError(f"{where} does not define a vcasync.cli.Command named COMMAND")
    return obj


def available_commands() -> dict[str, Command]:
    """Built-in commands (modules of ``vcasync.commands``) and those of installed plugins."""
    from importlib.metadata import entry_points

    from . import commands

    found: dict[str, Command] = {}
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{commands.__name__}.{info.name}")
        if hasattr(module, "COMMAND"):
            cmd = _check(module.__name__, module.COMMAND)
            found[cmd.name] = cmd
    for ep in entry_points(group="vcasync.commands"):
        if ep.name in found:
            continue
        try:
            found[ep.name] = _check(f"entry point {ep.value}", ep.load())
        except ImportError as exc:
            log.warning("command %r is unavailable: %s", ep.name, exc)
    return found


def read_secret(env: str, file: Path | None, *, what: str) -> str | None:
    """A secret from ``file`` (its first line, without surrounding blanks) or environment variable
    ``env``; never from a flag value, which any user could read with ``ps``. Both set: the file wins,
    with a warning.

    The first line only, so a file may carry a note below its secret. An empty first line, and a
    secret holding a control character (a CR, a tab, an escape), are refused with a
    :class:`ConfigError` that names the file or variable and never the secret: a worker sends the
    secret in an HTTP header, which refuses such characters, so no worker could join with it."""
    from_env = os.environ.get(env) or None
    if file is not None:
        try:
            with file.open(encoding="utf-8", newline="") as f:   # a lone CR is no line break here
                text = f.read()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read the {what} file {file}: {exc}") from exc
        value = text.split("\n", 1)[0].strip()
        if not value:
            raise ConfigError(f"the {what} file {file} is empty" if not text.strip() else
                              f"the first line of the {what} file {file} is empty (the secret is "
                              "the file's first line)")
        _check_printable(value, f"the first line of the {what} file {file}")
        if from_env:
            log.warning("both %s and a %s file are set; using the file", env, what)
        return value
    if from_env is not None:
        _check_printable(from_env, f"{env} ({what})")
    return from_env


def read_join_secret(file: Path | None) -> str | None:
    """The join secret from ``file`` or ``VCASYNC_JOIN_SECRET`` (:func:`read_secret`), refused when
    shorter than the coordinator accepts: every command that reads it (``coordinator``, ``worker``,
    ``ray``) reads it here, so each refuses what no coordinator would take, before starting."""
    from .server import check_length

    secret = read_secret("VCASYNC_JOIN_SECRET", file, what="join secret")
    if secret is not None:
        check_length(secret, "the join secret (VCASYNC_JOIN_SECRET)" if file is None else
                     f"the join secret in {file}")
    return secret


def read_join_credential(secret_file: Path | None, *,
                         file_flag: bool = True) -> tuple[str | None, str | None]:
    """The join secret (:func:`read_join_secret`) and the join token (``VCASYNC_JOIN_TOKEN``, checked
    the same way) a worker joins with; a :class:`ConfigError` when neither is set (naming
    ``--join-secret-file`` where the command has that flag)."""
    from .server import check_length

    secret = read_join_secret(secret_file)
    token = read_secret("VCASYNC_JOIN_TOKEN", None, what="join token")
    if token is not None:
        check_length(token, "the join token (VCASYNC_JOIN_TOKEN)")
    if not secret and not token:
        raise ConfigError("no join credential: set VCASYNC_JOIN_SECRET or VCASYNC_JOIN_TOKEN"
                          + (" (or --join-secret-file)" if file_flag else ""))
    return secret, token


def join_credential_env(secret: str | None, token: str | None) -> dict[str, str]:
    """The environment a worker started elsewhere (a Ray actor) reads the join credential
    :func:`read_join_credential` returned from: ``VCASYNC_JOIN_SECRET`` and ``VCASYNC_JOIN_TOKEN``."""
    env = {"VCASYNC_JOIN_SECRET": secret, "VCASYNC_JOIN_TOKEN": token}
    return {var: value for var, value in env.items() if value}


def _check_printable(secret: str, where: str) -> None:
    if any(unicodedata.category(c) == "Cc" for c in secret):
        raise ConfigError(f"{where} holds a control character (a line break, tab or escape); a "
                          "secret is printable text on one line")


def setup_logging(level: str) -> None:
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)


def build_parser(commands: dict[str, Command]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vcasync",
        description="Train PyTorch models on fleets of preemptible, unreliable machines. "
                    "'vcasync COMMAND --help' describes each command.",
        epilog="exit status: " + ", ".join(f"{int(c)} {c.name.lower()}" for c in ExitCode))
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, cmd in sorted(commands.items()):
        p = sub.add_parser(name, help=cmd.help, description=cmd.help)
        cmd.configure(p)
        env = environment_help(name)
        if env:
            p.formatter_class = argparse.RawDescriptionHelpFormatter
            p.epilog = f"{p.epilog.rstrip()}\n\n{env}" if p.epilog else env
    return parser


#: The exit status of an error that ends a command, first match wins (``what`` prefixes its message).
#: An unknown storage URL scheme or policy name, a backend whose package is not installed, or a
#: policy plugin that fails validation (PluginValidationError, a ConfigError) is the configuration
#: (or the install) to fix, nothing that ran and failed.
_EXIT_FOR: tuple[tuple[type[VCAsyncError] | tuple[type[VCAsyncError], ...], ExitCode, str], ...] = (
    ((ConfigError, BackendUnavailableError, UnknownPolicyError), ExitCode.CONFIG, "configuration error"),
    (RunIncompleteError, ExitCode.INCOMPLETE, "incomplete"),
    # storage that cannot be used (a lost snapshot, another coordinator on the run, a missing
    # bucket): "restart and the run resumes" (exit 1) would loop; the storage is what to fix
    (StorageError, ExitCode.STORAGE, "storage error"),
    (VCAsyncError, ExitCode.ERROR, ""),
)


def main(argv: Sequence[str] | None = None, *, commands: Mapping[str, Command] | None = None) -> int:
    """Entry point of the ``vcasync`` console script; ``commands`` replaces the registry (for a
    test-only entry point such as the repository's ``harness.chaos_coordinator``).

    SIGTERM and SIGINT are held from here on, before the commands' imports (torch, aiohttp: seconds
    on a loaded machine), until the command hands them over or they are released to it."""
    _early_signals.hold()
    try:
        commands = dict(commands) if commands is not None else available_commands()
        parser = build_parser(commands)
        args = parser.parse_args(argv)
    except BaseException:    # --help, a usage error (SystemExit): a signal held meanwhile acts now
        _early_signals.release()
        raise
    setup_logging(args.log_level)
    command = commands[args.command]
    try:
        if not command.handles_signals:
            _early_signals.release()
        return command.run(args)
    except VCAsyncError as exc:
        code, what = next((code, what) for kinds, code, what in _EXIT_FOR if isinstance(exc, kinds))
        print(f"vcasync {args.command}: {what or type(exc).__name__}: {exc}", file=sys.stderr)
        return code
    except KeyboardInterrupt:
        return ExitCode.INTERRUPTED
    finally:    # a command that failed before its hand-over: the process's handling back
        _early_signals.release(act=False)
        _early_signals.give_back()     # and after one: what its event loop left goes


def console() -> NoReturn:
    """The ``vcasync`` console script and ``python -m vcasync``: :func:`main`, then exit with its
    status, which a SIGTERM or SIGINT while the process exits (interpreter shutdown, torch's
    teardown: 0.1-0.3 s) no longer replaces; a worker that had just finished exited 143 on a
    preemption notice. (:func:`main` itself leaves the signals as it found them: it is also called
    in-process.)"""
    code = main()
    _early_signals.ignore_while_exiting()
    raise SystemExit(code)
