"""The demo's upper bounds, checked before anything starts (:class:`vcasync.demo.run.DemoConfig`).

A module of constants alone: ``vcasync demo --help`` states them, and the CLI builds every
subcommand's flags on each ``vcasync`` call, so it must not import :mod:`vcasync.demo.run` (its
workloads, models and process plumbing) to say them.
"""

from __future__ import annotations

__all__ = ["MAX_DELAY_S", "MAX_EPOCHS", "MAX_PREEMPTIONS", "MAX_PREEMPT_PER_MIN", "MAX_STEPS",
           "MAX_WALL_S", "MAX_WORKERS"]

#: Every worker is a process importing torch (a few hundred MB each), and the demo runs on one
#: machine: 100,000 of them were accepted, as were 2**40 local steps per unit and delays of ``inf``
#: seconds.
MAX_WORKERS = 64
MAX_EPOCHS = 10_000
MAX_STEPS = 1_000_000
MAX_PREEMPTIONS = 10_000
MAX_PREEMPT_PER_MIN = 60.0
#: the longest delay, pause or timeout a demo takes (a step's pace, a restart, a grace period, a lease)
MAX_DELAY_S = 3600.0
#: the longest --max-wall (a week: a demo is not a production run)
MAX_WALL_S = 7 * 24 * 3600.0
