"""What a ``vcasync`` command's exit status means: one enum every command (and the simulator) uses.

Kept out of :mod:`vcasync.cli` so a room that only needs the codes (``vcasync.sim``) does not import
the command registry, which imports every command.
"""

from __future__ import annotations

import enum

__all__ = ["ExitCode"]


class ExitCode(enum.IntEnum):
    """What a ``vcasync`` command's exit status means (documented in docs/leases.md)."""

    OK = 0            #: the run finished and every work unit was merged (a worker: it heard the run finished)
    ERROR = 1         #: an unexpected error ended the command
    CONFIG = 2        #: the configuration (flags, run.toml, environment) is wrong; nothing was changed
    PARKED = 3        #: the run ended with work units parked (given up after failing); nothing lost
    STORAGE = 4       #: storage failed in a way that made progress impossible
    INCOMPLETE = 5    #: not finished (a time limit, demo workers that crashed out); what was merged is kept
    INTERRUPTED = 130  #: stopped by a signal (SIGTERM, SIGINT) before the run finished
