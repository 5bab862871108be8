"""One coercer from configuration values to annotated types: TOML/JSON values, or URL-query text.

Three places read typed parameters from untyped sources: a policy's constructor parameters
(:mod:`vcasync.policy`), the run configuration's tables (:mod:`vcasync.runconfig`) and a storage URL's
query options (backends). They all call :func:`coerce`, so a value means the same everywhere and a
wrong one is refused with the same message: ``<where> must be <type>, got <value>``.

Vocabulary (:func:`supported`): ``Any``, ``bool``, ``int``, ``float`` (an ``int`` is accepted and
converted), ``str``, ``None``, ``pathlib.Path`` (from a string), ``Literal[...]`` (same type and
value), unions (``X | None``; exact types are tried before ``float`` and ``str``, so ``1`` stays an
``int``), ``list[X]``, ``tuple[X, ...]``, ``Sequence[X]`` and ``frozenset[X]`` (items coerced),
``dict[str, X]`` / ``Mapping[str, X]`` (built as a dict) and dataclasses (from a table: unknown keys
are refused by name, fields coerced recursively).

With ``text=True`` the value is a string from a URL query: ``bool`` reads ``1/true/yes/on`` and
``0/false/no/off``, numbers are parsed, an empty string is ``None`` where ``None`` is allowed, and
containers or tables cannot be given this way.

>>> coerce(3, float, "alpha")
3.0
>>> coerce("off", bool | None, "option 'durable'", text=True)
False
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar, Union

from .errors import ConfigError

__all__ = ["SEED_RANGE", "argument_number", "coerce", "describe_type", "from_table", "is_finite_number",
           "is_seed", "parsed_or_word", "supported"]

D = TypeVar("D")

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})
_SEQUENCES: tuple[Any, ...] = (list, tuple, Sequence, frozenset)
_MAPPINGS: tuple[Any, ...] = (dict, Mapping)


class _Mismatch(Exception):
    """Internal: a value does not fit an annotation (the caller names both)."""


def describe_type(hint: Any) -> str:
    """A short readable name for an annotation (``float``, ``'a' | 'b'``, ``int | None``)."""
    if hint is Any:
        return "Any"
    if hint is None or hint is type(None):
        return "None"
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is Literal:
        return " | ".join(repr(a) for a in args)
    if origin in (Union, types.UnionType):
        return " | ".join(describe_type(a) for a in args)
    if origin is not None:
        inner = ", ".join("..." if a is Ellipsis else describe_type(a) for a in args)
        return f"{getattr(origin, '__name__', str(origin))}[{inner}]"
    if dataclasses.is_dataclass(hint):
        return f"a {getattr(hint, '__name__', repr(hint))} table"
    return getattr(hint, "__name__", repr(hint))


def supported(hint: Any) -> bool:
    """Whether :func:`coerce` can build ``hint`` from a configuration value."""
    if hint is Any or hint in (bool, int, float, str, None, type(None), Path):
        return True
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return True
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is Literal:
        return all(isinstance(a, (bool, int, float, str)) or a is None for a in args)
    if origin in (Union, types.UnionType):
        return all(supported(a) for a in args)
    if origin in (list, Sequence, frozenset):
        return len(args) == 1 and supported(args[0])
    if origin is tuple:
        return len(args) == 2 and args[1] is Ellipsis and supported(args[0])
    if origin in _MAPPINGS:
        return len(args) == 2 and args[0] is str and supported(args[1])
    return hint in (dict, Mapping, list, tuple)


def is_finite_number(value: object, low: float | None = None, *, strict: bool = False,
                     high: float | None = None, high_strict: bool = False) -> bool:
    """Whether ``value`` is an int or float (not a bool), finite, and within ``[low, high]``
    (``strict``/``high_strict``: that bound itself excluded; None: no bound). NaN, the infinities and
    an int too large for a float are not. The one such check: price rows, spot paths, the
    simulator's and the benches' arguments and the demo's config all call it.

    >>> is_finite_number(3), is_finite_number(True), is_finite_number(float("nan"))
    (True, False, False)
    >>> is_finite_number(0.0, 0, strict=True), is_finite_number(1, 0, high=1, high_strict=True)
    (False, False)
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        if not math.isfinite(value):
            return False
    except OverflowError:
        return False
    return ((low is None or (value > low if strict else value >= low))
            and (high is None or (value < high if high_strict else value <= high)))


#: What every seed may be (``[model] seed`` / ``vcasync coordinator --seed``, the simulator's and the
#: demo's): what ``torch.manual_seed`` and numpy's generators all take. Said in messages as
#: ``seed must be in [0, 2**32), got -1``.
SEED_RANGE = "[0, 2**32)"


def is_seed(value: object) -> bool:
    """Whether ``value`` is a whole number in :data:`SEED_RANGE` (not a bool): the one seed check.

    >>> is_seed(0), is_seed(2**32 - 1), is_seed(-1), is_seed(2**32), is_seed(True)
    (True, True, False, False, False)
    """
    return type(value) is int and 0 <= value < 2**32


def argument_number(kind: type[int] | type[float], low: float | None = None, *, strict: bool = False,
                    high: float | None = None, high_strict: bool = False,
                    what: str | None = None) -> Callable[[str], float]:
    """An argparse ``type=``: ``kind`` parsed from the text, finite (:func:`is_finite_number`) and
    within ``[low, high]`` (``strict``/``high_strict``: the bound itself excluded; a whole number
    above ``low`` is said as one at least ``low + 1``). A bad value is argparse's error, which names
    the flag and exits 2 before anything runs: ``must be <what> <bounds>, got <text>``, ``what``
    "a whole number" or "a finite number" unless given ("": the bounds alone). The one such type:
    ``vcasync simulate``, ``vcasync ray up`` and the benches use it.

    >>> argument_number(int, 0, strict=True)("3"), argument_number(float, 0.5)("0.5")
    (3, 0.5)
    """
    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not {'a whole number' if kind is int else 'a number'}") from None
        if is_finite_number(value, low, strict=strict, high=high, high_strict=high_strict):
            return value
        bounds = []
        if low is not None:
            bounds.append(f">= {int(low) + 1:,d}" if kind is int and strict else
                          f"{'>' if strict else '>='} {kind(low):{',d' if kind is int else ',g'}}")
        if high is not None:
            bounds.append(f"{'<' if high_strict else '<='} {kind(high):{',d' if kind is int else ',g'}}")
        said = ("a whole number" if kind is int else "a finite number") if what is None else what
        text_bounds = " and ".join(bounds)
        raise argparse.ArgumentTypeError(
            f"must be {said}{' ' if said and text_bounds else ''}{text_bounds}, got {text}")

    parse.__name__ = kind.__name__      # argparse names the type in "invalid <name> value"
    return parse


#: How a value of TOML or JSON starts (a number, a sign, an array, a table, a quoted string): text
#: that starts so and does not parse is a mistyped value, never a bare word.
_VALUE_START = frozenset("0123456789+-[{\"'")


def parsed_or_word(raw: str, parse: Callable[[str], Any], where: str) -> Any:
    """``parse(raw)`` (TOML's or JSON's value grammar, raising a ValueError), or ``raw`` itself when
    it is a bare word (``digits``, ``sgd``, ``pkg.mod:fn``, a path): the one reading of the
    ``--unit-param`` / ``--policy-param KEY=VALUE`` flags. Text that starts like a value and does
    not parse (``0.1.2``, ``[``, ``"open``) is a :class:`ConfigError` naming ``where``: it became
    the string ``'0.1.2'``, refused by the trainer on every unit, far from the flag.

    >>> import json
    >>> parsed_or_word("0.5", json.loads, "lr"), parsed_or_word("digits", json.loads, "workload")
    (0.5, 'digits')
    """
    try:
        return parse(raw)
    except ValueError as exc:      # json.JSONDecodeError and tomllib.TOMLDecodeError are ValueErrors
        if raw[:1] not in _VALUE_START:
            return raw
        raise ConfigError(f"{where}: {raw!r} is not a valid value ({exc}); a string that starts "
                          f"with a digit, sign, bracket or quote must be quoted") from None


def coerce(value: Any, hint: Any, where: str, *, text: bool = False) -> Any:
    """``value`` as ``hint``; raise :class:`ConfigError` ``"<where> must be <type>, got <value>"``.

    ``where`` names the parameter (``"units.shards"``, ``"parameter 'alpha' of policy 'vcasgd'"``,
    ``"option 'durable'"``); a field of a nested table is named ``where.field``.
    """
    try:
        return _coerce(value, hint, where, text)
    except _Mismatch:
        raise ConfigError(f"{where} must be {describe_type(hint)}, got {_show(value)}") from None


def _show(value: Any) -> str:
    """``repr(value)``, but an int too long to print (over 4,300 digits) by its size."""
    try:
        return repr(value)
    except ValueError:
        return f"an int of {value.bit_length()} bits" if isinstance(value, int) else object.__repr__(value)


def from_table(cls: type[D], table: Mapping[str, Any], where: str) -> D:
    """Dataclass ``cls`` from a table: unknown keys and wrong types are :class:`ConfigError`\\ s
    that name them; the dataclass's own checks (``__post_init__``) still run."""
    if not (dataclasses.is_dataclass(cls) and isinstance(cls, type)):
        raise TypeError(f"{cls!r} is not a dataclass")
    if not isinstance(table, Mapping):
        raise ConfigError(f"{where} must be {describe_type(cls)}, got {table!r}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(str(k) for k in set(table) - names)
    if unknown:
        raise ConfigError(f"unknown key(s) in [{where}]: {', '.join(unknown)} "
                          f"(known: {', '.join(sorted(names))})")
    kwargs = {k: coerce(v, hints[k], f"{where}.{k}") for k, v in table.items()}
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise ConfigError(f"[{where}]: {exc}") from exc


def _union_order(arg: Any) -> int:
    """None first, then the exact scalars, ``float`` after ``int``, ``str`` last (it takes any text)."""
    ranks = {type(None): 0, bool: 1, int: 2, float: 3, str: 5}
    return ranks.get(arg, 4)


def _coerce(value: Any, hint: Any, where: str, text: bool) -> Any:
    if hint is Any:
        return value
    if hint is None or hint is type(None):
        if value is None or (text and value == ""):
            return None
        raise _Mismatch
    if text and isinstance(value, str):
        value = _parse_text(value, hint, where)
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise _Mismatch
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise _Mismatch
    if hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            try:
                return float(value)
            except OverflowError:
                raise ConfigError(f"{where} must be float, got an int of {int(value).bit_length()} bits, too "
                                  f"large for a float (the largest is about 1.8e308)") from None
        raise _Mismatch
    if hint is str:
        if isinstance(value, str):
            return value
        raise _Mismatch
    if hint is Path:
        if isinstance(value, (str, Path)):
            return Path(value)
        raise _Mismatch
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is Literal:
        for a in args:
            candidate = value
            if text and isinstance(value, str) and isinstance(a, bool | int | float):
                candidate = _parse_text(value, type(a), where)      # ?mode=1 for Literal[1, 2]
            if type(a) is type(candidate) and a == candidate:
                return candidate
        raise _Mismatch
    if origin in (Union, types.UnionType):
        for a in sorted(args, key=_union_order):
            try:
                return _coerce(value, a, where, text)
            except _Mismatch:
                continue
        raise _Mismatch
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        if isinstance(value, hint):
            return value
        if not isinstance(value, Mapping):
            raise _Mismatch
        return from_table(hint, value, where)
    if origin in _SEQUENCES or hint in (list, tuple):
        if isinstance(value, (str, bytes)) or not isinstance(value, (Sequence, frozenset, set)):
            raise _Mismatch
        item = args[0] if args else Any
        items = [_coerce(v, item, where, text) for v in value]
        kind = origin or hint
        return items if kind is list else frozenset(items) if kind is frozenset else tuple(items)
    if origin in _MAPPINGS or hint in _MAPPINGS:
        if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
            raise _Mismatch
        item = args[1] if len(args) == 2 else Any
        return {k: _coerce(v, item, f"{where}.{k}", text) for k, v in value.items()}
    raise ConfigError(f"{where} has type {describe_type(hint)}, which a configuration value cannot "
                      f"express")


def _parse_text(raw: str, hint: Any, where: str) -> Any:
    """URL-query text as the scalar ``hint`` wants (other hints get the string unchanged)."""
    if hint is bool:
        low = raw.lower()
        return True if low in _TRUE else False if low in _FALSE else raw
    if hint in (int, float):
        try:
            return hint(raw)
        except ValueError:
            return raw
    origin = typing.get_origin(hint)
    if origin in _SEQUENCES or origin in _MAPPINGS or hint in (list, tuple, dict, Mapping) or (
            dataclasses.is_dataclass(hint)):
        raise ConfigError(f"{where} cannot be given as text (a URL query); pass it as a keyword "
                          f"argument")
    return raw
