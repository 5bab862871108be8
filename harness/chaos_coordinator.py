"""``python -m harness.chaos_coordinator [--log-level L] coordinator ARGS``: the
``vcasync coordinator`` command with chaos hooks, for chaos tests only.

The arguments are exactly those of ``vcasync coordinator``; on top, this entry point reads the test
switches of :mod:`harness.hooks` from the environment (``VCASYNC_PAUSE_AT``,
``VCASYNC_PAUSE_DIR``, ``VCASYNC_PAUSE_S``, ``VCASYNC_STORAGE_FAULTS``) and wraps the coordinator's
policy and storage with them: pause points a test can SIGKILL the process at, and injected storage
faults. The production command never reads those variables, so nothing left in a server's
environment can turn them on; the same ``serve`` runs underneath, so what a chaos test kills is
the real coordinator.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from vcasync.cli import Command
from vcasync.cli import main as cli_main
from vcasync.commands import coordinator

from .hooks import ChaosHooks

__all__ = ["COMMAND", "main"]


def _run(a: argparse.Namespace) -> int:
    return coordinator.launch(a, hooks=ChaosHooks.from_env(os.environ))


COMMAND = Command(name="coordinator", help="serve a training run with chaos hooks (tests only)",
                  configure=coordinator.COMMAND.configure, run=_run, handles_signals=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` as the ``vcasync`` command line, with only this ``coordinator``."""
    return cli_main(argv, commands={COMMAND.name: COMMAND})


if __name__ == "__main__":
    sys.exit(main())
