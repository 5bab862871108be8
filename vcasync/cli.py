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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path

from .errors import ConfigError, VCAsyncError
from .exit_codes import ExitCode

__all__ = ["Command", "ExitCode", "available_commands", "main", "read_secret"]

log = logging.getLogger("vcasync.cli")


@dataclass(frozen=True, slots=True)
class Command:
    """One subcommand: ``configure`` adds its arguments, ``run`` returns the exit status."""

    name: str
    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


def _check(where: str, obj: object) -> Command:
    if not isinstance(obj, Command):
        raise ConfigError(f"{where} does not define a vcasync.cli.Command named COMMAND")
    return obj


def available_commands() -> dict[str, Command]:
    """Built-in commands (modules of ``vcasync.commands``) and those of installed plugins."""
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
    """A secret from ``file`` (first line) or environment variable ``env``; never from a flag value,
    which any user could read with ``ps``. Both set: the file wins, with a warning."""
    from_env = os.environ.get(env) or None
    if file is not None:
        try:
            value = file.read_text().strip()
        except OSError as exc:
            raise ConfigError(f"cannot read the {what} file {file}: {exc}") from exc
        if not value:
            raise ConfigError(f"the {what} file {file} is empty")
        if from_env:
            log.warning("both %s and a %s file are set; using the file", env, what)
        return value
    return from_env


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
    return parser


def main(argv: Sequence[str] | None = None, *, commands: Mapping[str, Command] | None = None) -> int:
    """Entry point of the ``vcasync`` console script; ``commands`` replaces the registry (for a
    test-only entry point such as the repository's ``harness.chaos_coordinator``)."""
    commands = dict(commands) if commands is not None else available_commands()
    parser = build_parser(commands)
    args = parser.parse_args(argv)
    setup_logging(args.log_level)
    try:
        return commands[args.command].run(args)
    except ConfigError as exc:
        print(f"vcasync {args.command}: configuration error: {exc}", file=sys.stderr)
        return ExitCode.CONFIG
    except VCAsyncError as exc:
        print(f"vcasync {args.command}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return ExitCode.ERROR
    except KeyboardInterrupt:
        return ExitCode.INTERRUPTED
