"""Constructor parameters of plugins: introspection when registered, type checks when built.

A plugin's constructor is its configuration schema. Every parameter must be keyword-usable, carry a
type annotation from a small vocabulary that TOML and JSON can express, and have a default of that
type, so ``build_policy(name)`` always works and ``build_policy(name, params)`` can reject a wrong
name or type with a message that names it, before the plugin's own code runs.

Supported annotations: ``Any``, ``bool``, ``int``, ``float`` (an ``int`` is accepted and converted),
``str``, ``None``, ``Literal[...]``, unions (``X | None``), ``list[X]``, ``tuple[X, ...]``,
``Sequence[X]`` (built as a tuple) and ``dict[str, X]`` / ``Mapping[str, X]`` (built as a dict).
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Union

from .errors import ConfigError, PluginValidationError

__all__ = ["ParamSpec", "coerce_params", "describe_type", "param_specs"]

_NO_DEFAULT: Any = inspect.Parameter.empty


@dataclass(frozen=True, slots=True)
class ParamSpec:
    """One constructor parameter: its name, resolved type annotation and default."""

    name: str
    annotation: Any
    default: Any

    @property
    def type_name(self) -> str:
        return describe_type(self.annotation)


def describe_type(hint: Any) -> str:
    """A short readable name for a supported annotation (``float``, ``'a' | 'b'``, ``int | None``)."""
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
    return getattr(hint, "__name__", repr(hint))


def _supported(hint: Any) -> bool:
    if hint is Any or hint in (bool, int, float, str, None, type(None)):
        return True
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is Literal:
        return all(isinstance(a, (bool, int, float, str)) or a is None for a in args)
    if origin in (Union, types.UnionType):
        return all(_supported(a) for a in args)
    if origin in (list, Sequence):
        return len(args) == 1 and _supported(args[0])
    if origin is tuple:
        return len(args) == 2 and args[1] is Ellipsis and _supported(args[0])
    if origin in (dict, Mapping):
        return len(args) == 2 and args[0] is str and _supported(args[1])
    return False


class _Mismatch(Exception):
    """Internal: a value does not fit an annotation."""


def _coerce(value: Any, hint: Any) -> Any:
    """``value`` converted to ``hint`` (int -> float, list -> tuple ...), or raise :class:`_Mismatch`."""
    if hint is Any:
        return value
    if hint is None or hint is type(None):
        if value is None:
            return None
        raise _Mismatch
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
            return float(value)
        raise _Mismatch
    if hint is str:
        if isinstance(value, str):
            return value
        raise _Mismatch
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is Literal:
        for a in args:
            if type(a) is type(value) and a == value:
                return value
        raise _Mismatch
    if origin in (Union, types.UnionType):
        # Exact types first, so that 1 stays an int in ``int | float``.
        for a in sorted(args, key=lambda a: a is float):
            try:
                return _coerce(value, a)
            except _Mismatch:
                continue
        raise _Mismatch
    if origin in (list, tuple, Sequence):
        if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
            raise _Mismatch
        items = [_coerce(v, args[0]) for v in value]
        return items if origin is list else tuple(items)
    if origin in (dict, Mapping):
        if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
            raise _Mismatch
        return {k: _coerce(v, args[1]) for k, v in value.items()}
    raise _Mismatch  # pragma: no cover - rejected by _supported at registration


def param_specs(plugin: str, cls: type) -> dict[str, ParamSpec]:
    """The constructor parameters of ``cls``, checked; raises :class:`PluginValidationError`."""
    try:
        sig = inspect.signature(cls)
    except (TypeError, ValueError) as exc:
        raise PluginValidationError(f"cannot read the constructor signature: {exc}",
                                    plugin=plugin) from exc
    try:
        hints = typing.get_type_hints(inspect.getattr_static(cls, "__init__"))
    except Exception as exc:  # an annotation that does not resolve: any error here is the plugin's
        raise PluginValidationError(f"constructor annotations do not resolve: {exc}",
                                    plugin=plugin) from exc
    specs: dict[str, ParamSpec] = {}
    for p in sig.parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.POSITIONAL_ONLY):
            raise PluginValidationError(
                f"constructor parameter {p.name!r} must be a plain keyword parameter "
                f"(no *args, **kwargs or positional-only parameters)", plugin=plugin)
        if p.default is _NO_DEFAULT:
            raise PluginValidationError(
                f"constructor parameter {p.name!r} needs a default, so the plugin builds "
                f"without parameters", plugin=plugin)
        if p.name not in hints:
            raise PluginValidationError(f"constructor parameter {p.name!r} needs a type annotation",
                                        plugin=plugin)
        hint = hints[p.name]
        if not _supported(hint):
            raise PluginValidationError(
                f"constructor parameter {p.name!r} has type {describe_type(hint)}, which a config "
                f"file cannot express (use bool, int, float, str, None, Literal, unions, lists, "
                f"tuples or dict[str, ...])", plugin=plugin)
        try:
            _coerce(p.default, hint)
        except _Mismatch:
            raise PluginValidationError(
                f"constructor parameter {p.name!r}: default {p.default!r} is not a "
                f"{describe_type(hint)}", plugin=plugin) from None
        specs[p.name] = ParamSpec(p.name, hint, p.default)
    return specs


def coerce_params(plugin: str, specs: Mapping[str, ParamSpec],
                  params: Mapping[str, Any]) -> dict[str, Any]:
    """Check ``params`` against ``specs``; raise :class:`ConfigError` naming every unknown one."""
    if not isinstance(params, Mapping):
        raise ConfigError(f"parameters of {plugin!r} must be a table/mapping, got "
                          f"{type(params).__name__}")
    unknown = sorted(str(k) for k in params if k not in specs)
    if unknown:
        known = ", ".join(sorted(specs)) or "none"
        raise ConfigError(f"unknown parameter(s) for policy {plugin!r}: {', '.join(unknown)} "
                          f"(it takes: {known})")
    out: dict[str, Any] = {}
    for key, value in params.items():
        spec = specs[key]
        try:
            out[key] = _coerce(value, spec.annotation)
        except _Mismatch:
            raise ConfigError(f"parameter {key!r} of policy {plugin!r} must be {spec.type_name}, "
                              f"got {value!r}") from None
    return out
