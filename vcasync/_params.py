"""Constructor parameters of plugins: introspection when registered, type checks when built.

A plugin's constructor is its configuration schema. Every parameter must be keyword-usable, carry a
type annotation from a small vocabulary that TOML and JSON can express, and have a default of that
type, so ``build_policy(name)`` always works and ``build_policy(name, params)`` can reject a wrong
name or type with a message that names it, before the plugin's own code runs.

Supported annotations and what a value becomes: :mod:`vcasync.coerce`, the one coercer the run
configuration and the storage URL options use too.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .coerce import coerce, describe_type, supported
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
        if not supported(hint):
            raise PluginValidationError(
                f"constructor parameter {p.name!r} has type {describe_type(hint)}, which a config "
                f"file cannot express (use bool, int, float, str, None, Path, Literal, unions, "
                f"list[X], tuple[X, ...], Sequence[X], frozenset[X], dict[str, X] or dataclasses)",
                plugin=plugin)
        try:
            coerce(p.default, hint, f"the default of {p.name!r}")
        except ConfigError:
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
    return {key: coerce(value, specs[key].annotation, f"parameter {key!r} of policy {plugin!r}")
            for key, value in params.items()}
