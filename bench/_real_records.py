"""A real run's record for calibration, saved and read back: replays without new real runs.

``bench.convergence --save-records DIR`` writes one JSON file per real run (``<workload>-seed<n>.json``):
its report and what :func:`bench.convergence.real_run` measured for the replay (per-sample CPU,
start-ups, the outages, the monitor's scoring instants, the noticed workers' exits).
``--replay-records FILE ...`` replays them with the simulator as it is now, so a change to the
replay is measured on the same real runs before and after it, not on new runs on a machine whose
load moves the real timings (2 cores shared with other jobs).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from vcasync.errors import ConfigError
from vcasync.sim.fleet import Outage

__all__ = ["FORMAT", "load_record", "save_record"]

#: The record's format; a file of another is refused by name.
FORMAT = "vcasync-real-run/1"


def _finite_or_none(x: Any) -> Any:
    """JSON has no NaN or infinity: a non-finite float is written as null."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {str(k): _finite_or_none(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_finite_or_none(v) for v in x]
    return x


def save_record(path: Path, *, workload: str, seed: int, workers: int, cores: float | None,
                real: dict[str, Any]) -> None:
    """Write ``real`` (:func:`bench.convergence.real_run`'s ``report`` and ``measured``) to ``path``."""
    measured = dict(real["measured"])
    measured["outages"] = {str(slot): [[o.down_s, o.up_s, o.notice_s] for o in outs]
                           for slot, outs in measured["outages"].items()}
    doc = {"format": FORMAT, "workload": workload, "seed": seed, "workers": workers, "cores": cores,
           "report": real["report"], "measured": measured}
    path.write_text(json.dumps(_finite_or_none(doc), default=str) + "\n")


def load_record(path: Path) -> dict[str, Any]:
    """A record :func:`save_record` wrote: ``workload``, ``seed``, ``workers``, ``cores`` and
    ``real`` (``report`` and ``measured``, the outages as :class:`Outage` again). A file that is
    not one is refused with what is wrong, naming it."""
    try:
        doc = json.loads(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the real-run record: {exc.strerror or exc}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not a real-run record (not JSON: {exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        got = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise ConfigError(f"{path}: not a real-run record of format {FORMAT!r} (got {got!r}); "
                          "bench.convergence --save-records writes them")
    missing = [k for k in ("workload", "seed", "workers", "report", "measured") if k not in doc]
    if missing:
        raise ConfigError(f"{path}: the real-run record lacks {missing}")
    measured = dict(doc["measured"])
    try:
        measured["outages"] = {int(slot): [Outage(float(d), float(u), float(n)) for d, u, n in outs]
                               for slot, outs in measured.get("outages", {}).items()}
    except (TypeError, ValueError, AttributeError):
        raise ConfigError(f"{path}: the record's outages are not [down_s, up_s, notice_s] rows per "
                          "slot") from None
    return {"workload": str(doc["workload"]), "seed": int(doc["seed"]), "workers": int(doc["workers"]),
            "cores": doc.get("cores"), "real": {"report": doc["report"], "measured": measured}}
