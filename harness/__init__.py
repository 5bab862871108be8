"""The repository's own test harness: chaos runs, hostile inputs, fuzzing, probes, process fleets.

Not part of the installed package (``pyproject.toml`` lists only ``vcasync*`` packages, so a wheel
never carries it): the tests and ``bench/`` import it from a source checkout, where the repository
root is on ``sys.path`` (``pytest``'s ``pythonpath``, or ``python -m bench.X`` run from the root).
What users import to test their own policies and backends is the public kit, :mod:`vcasync.testing`.

- :mod:`harness.fleet`: a coordinator and workers as real processes, killed and restarted at will;
- :mod:`harness.hooks` and :mod:`harness.chaos_coordinator`: pause points and injected storage
  faults, honoured only by the test-only entry point ``python -m harness.chaos_coordinator``;
- :mod:`harness.chaos`, :mod:`harness.chaos_driver`, :mod:`harness.audit`: the chaos run and the
  audit of what survived it;
- :mod:`harness.probe`, :mod:`harness.hostile`, :mod:`harness.hostile_payloads`,
  :mod:`harness.fuzz`: raw HTTP against a coordinator, hostile requests, the fuzzer.

Child processes that import the harness (``python -P -m harness.chaos_coordinator``) get the
repository root on ``PYTHONPATH`` from :func:`harness_env`, whatever their working directory.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Final

__all__ = ["CHAOS_COORDINATOR", "ROOT", "harness_env"]

#: The repository root: the folder that holds ``harness/`` (and the source ``vcasync/``).
ROOT: Final = Path(__file__).resolve().parent.parent

#: The module a child runs for ``vcasync coordinator`` with the chaos hooks (tests only).
CHAOS_COORDINATOR: Final = "harness.chaos_coordinator"


def harness_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with the repository root first on ``PYTHONPATH``, so a child can import ``harness``.

    Children run ``python -P`` (see ``vcasync._spawn``), which keeps their working directory off
    ``sys.path``; ``PYTHONPATH`` is still honoured.
    """
    rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(ROOT)]
    return {**env, "PYTHONPATH": os.pathsep.join([str(ROOT), *rest])}
