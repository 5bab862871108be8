"""Spreads for honest figures: every headline ratio is printed and saved with the min, median and
max of its repetitions, so a reader sees how much a noisy machine moved it. Also what every bench's
arguments share: types that refuse a value argparse-style (exit 2, the value and what is allowed
named), and ``--quick`` as a set of defaults that a flag given explicitly beats."""

from __future__ import annotations

import argparse
import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from vcasync.coerce import argument_number


def spread(values: Sequence[float], digits: int = 3) -> list[float]:
    """``[min, median, max]`` of ``values`` (all of them: no repetition is dropped)."""
    if not values:
        raise ValueError("no repetitions to summarise")
    return [round(min(values), digits), round(statistics.median(values), digits),
            round(max(values), digits)]


def _gave_none(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _number_like(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def over_reps(reps: Sequence[Mapping[str, Any]], headline: Iterable[str],
              is_count: Callable[[str], bool]) -> dict[str, Any]:
    """One set of figures from each repetition's (``reps``, the same keys in each), none dropped.

    * a count (``is_count(key)``: failures, timeouts, leases expired wrongly) is the *sum* over the
      repetitions, with ``KEY_per_rep`` beside it when ``KEY`` is in ``headline``;
    * any other number is the median, with ``KEY_spread`` (``[min, median, max]``, :func:`spread`)
      beside it when ``KEY`` is in ``headline``; a repetition that gave none (None or NaN: too
      little to time) makes the figure None, its spread None, and ``reasons[KEY]`` says which;
    * a dict of counts (errors by kind) is summed kind by kind;
    * anything else is kept when every repetition agrees, else the list of them.

    The order is the first repetition's keys, each followed by its spread; ``reps`` the number."""
    if not reps:
        raise ValueError("no repetitions to summarise")
    wanted = set(headline)
    out: dict[str, Any] = {}
    reasons: dict[str, str] = {}
    for key in reps[0]:
        values = [r[key] for r in reps]
        if is_count(key) and all(_number_like(v) for v in values):
            out[key] = sum(values)
            if key in wanted:
                out[f"{key}_per_rep"] = list(values)
        elif all(_number_like(v) or _gave_none(v) for v in values) \
                and (key in wanted or any(not _gave_none(v) for v in values)):
            missing = [i + 1 for i, v in enumerate(values) if _gave_none(v)]
            if missing:
                out[key] = None
                reasons[key] = (f"not measured: repetition(s) {', '.join(map(str, missing))} of "
                                f"{len(values)} gave none")
            else:   # a figure every repetition agrees on stays as it is (an int an int)
                out[key] = values[0] if len(set(values)) == 1 else statistics.median(values)
            if key in wanted:
                out[f"{key}_spread"] = None if missing else spread(values)
        elif all(isinstance(v, Mapping) for v in values):
            total: dict[str, Any] = {}
            for v in values:
                for kind, n in v.items():
                    total[kind] = total.get(kind, 0) + n
            out[key] = total
        else:
            out[key] = values[0] if all(v == values[0] for v in values) else list(values)
    out["reps"] = len(reps)
    if reasons:
        out["reasons"] = reasons
    return out


def show(values: Sequence[float], digits: int = 2) -> str:
    """``median (min-max)`` for a table cell."""
    lo, mid, hi = spread(values, digits)
    return f"{mid:.{digits}f} ({lo:.{digits}f}-{hi:.{digits}f})"


def _number(text: str, kind: type[int] | type[float], low: float, strict: bool) -> float:
    """``text`` as a finite ``kind`` above ``low`` (``strict``) or at least ``low``, else an
    argparse error naming it (whole numbers: the bound alone, "must be >= 1")."""
    return argument_number(kind, low, strict=strict, what="" if kind is int else None)(text)


def positive_int(text: str) -> int:
    """An argparse type: a whole number >= 1 (0 or -1 repetitions ended in 'no median for empty
    data', a negative fleet in a hang)."""
    return int(_number(text, int, 0, strict=True))


def positive_float(text: str) -> float:
    """An argparse type: a finite number > 0."""
    return _number(text, float, 0.0, strict=True)


def positive_ints(text: str) -> str:
    """An argparse type: comma-separated whole numbers >= 1, each once (:func:`repeated`), kept as
    the text."""
    _refuse_repeats([positive_int(part) for part in text.split(",")])
    return text


def non_negative_int(text: str) -> int:
    """An argparse type: a whole number >= 0 (warm-up counts, kills)."""
    return int(_number(text, int, 0, strict=False))


#: Seeds are 32-bit (SimConfig, the demo): a larger one ended in a ConfigError traceback mid-run.
SEED_LIMIT = 2**32


def seed_arg(text: str) -> int:
    """An argparse type: a seed, a whole number from 0 to 2**32 - 1."""
    value = non_negative_int(text)
    if value >= SEED_LIMIT:
        raise argparse.ArgumentTypeError(f"must be < {SEED_LIMIT:,d} (a 32-bit seed), got {text}")
    return value


def distinct_seeds(parser: argparse.ArgumentParser, seeds: Sequence[int]) -> None:
    """Refuse a seed given twice: the repeat is the same simulated cells (and the same preemption
    schedule and data order in a real run) counted again, so "5 of 5 seeds" of ``--seeds 0 0 0 0 0``
    had an interval of width 0."""
    twice = sorted(repeated(seeds))
    if twice:
        parser.error(f"argument --seeds: seed {', '.join(map(str, twice))} given twice: each seed is "
                     "one run in the mean and its interval, so name each once")


#: Why a list flag takes each value once: the figures are named by the value, so a repeat ran the
#: same measurement again and its figures replaced the first's (``bench.e2e --durability
#: journal,journal`` dropped the first run's failures and counted the second's twice).
ONCE = "each is measured once and names its figures, so a repeat would replace the first's"


def repeated(values: Iterable[Any]) -> list[Any]:
    """The values that occur more than once in ``values``, in the order they first repeat."""
    seen: list[Any] = []
    twice: list[Any] = []
    for v in values:
        if v in seen and v not in twice:
            twice.append(v)
        seen.append(v)
    return twice


def _refuse_repeats(values: Sequence[Any]) -> None:
    twice = repeated(values)
    if twice:
        raise argparse.ArgumentTypeError(f"{', '.join(map(repr, twice))} given twice: {ONCE}")


def distinct(parser: argparse.ArgumentParser, flag: str, values: Sequence[Any] | None,
             why: str = ONCE) -> None:
    """Refuse a value given twice to the list flag ``flag`` (nargs lists; the comma-list types
    check themselves): an argparse error naming it and ``why``, before anything runs."""
    twice = repeated(values or [])
    if twice:
        parser.error(f"argument {flag}: {', '.join(map(repr, twice))} given twice: {why}")


def non_negative_float(text: str) -> float:
    """An argparse type: a finite number >= 0 (rates, paces)."""
    return _number(text, float, 0.0, strict=False)


def vcasgd_alpha(text: str) -> float:
    """An argparse type: VC-ASGD's alpha, a number >= 0 and < 1 (the policy's own range)."""
    value = non_negative_float(text)
    if value >= 1:
        raise argparse.ArgumentTypeError(f"must be >= 0 and < 1, got {text}")
    return value


def one_of(allowed: Sequence[str]) -> Callable[[str], str]:
    """An argparse type: comma-separated names, each one of ``allowed`` and each once; kept as the
    text. An unknown name is named with the allowed ones (a size missing from a table ended in a
    ``KeyError`` traceback)."""
    def check(text: str) -> str:
        parts = [p.strip() for p in text.split(",")]
        bad = [p for p in parts if p not in allowed]
        if bad or not parts:
            raise argparse.ArgumentTypeError(
                f"unknown {', '.join(map(repr, bad)) or 'empty list'}; choose from {', '.join(allowed)}")
        _refuse_repeats(parts)
        return text
    return check


#: Where :func:`add_quick` leaves ``--quick``'s values for :func:`parse_args` (a parser default).
_QUICK = "_quick_defaults"


def add_quick(parser: argparse.ArgumentParser, quick: Mapping[str, Any], what: str) -> None:
    """Add ``--quick``: ``what`` it does, and ``quick``'s values for the parser's own options
    (``dest -> value``) as new defaults; parse with :func:`parse_args`, so a flag given explicitly
    still wins over them."""
    flags = ", ".join(" ".join(quick_flags({k: v})) for k, v in quick.items())
    parser.add_argument("--quick", action="store_true",
                        help=f"{what}" + (f" ({flags}; a flag given explicitly wins)" if flags else ""))
    parser.set_defaults(**{_QUICK: dict(quick)})


def parse_args(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """``parser.parse_args(argv)``; with ``--quick``, the values :func:`add_quick` named replace the
    defaults and ``argv`` is parsed again, so ``--quick --reps 5`` runs 5 repetitions (``--quick``
    overwrote explicit flags before)."""
    args = parser.parse_args(argv)
    quick: dict[str, Any] = vars(args).pop(_QUICK, {})
    unknown = sorted(set(quick) - set(vars(args)))
    if unknown:
        raise ValueError(f"--quick names options this parser lacks: {unknown}")
    if getattr(args, "quick", False) and quick:
        parser.set_defaults(**quick)
        args = parser.parse_args(argv)
        vars(args).pop(_QUICK, None)
    return args


def quick_flags(quick: Mapping[str, Any]) -> list[str]:
    """The command-line flags that say what ``quick`` says (``{"reps": 3}`` -> ``--reps 3``)."""
    out: list[str] = []
    for k, v in quick.items():
        out += [f"--{k.replace('_', '-')}", *(map(str, v) if isinstance(v, list | tuple) else [str(v)])]
    return out


def finite(obj: Any) -> Any:
    """``obj`` with every infinite or NaN float made None, for ``--json`` (a failed repetition is an
    infinite time; JSON has no Infinity, and a figure it made is no figure)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [finite(v) for v in obj]
    return obj
