"""The merge-policy contract and its registry.

A policy is a small class around pure tensor functions::

    init_state(model) -> state                      # tensors and scalars; checkpointed via the wire
    merge(model, update, state) -> model | None     # None keeps the model (e.g. a buffer is filling)
    flush(model, state) -> model | None             # optional: apply what is held, at the run's end

Rules every policy keeps (``vcasync.testing.check_policy`` holds a policy to them):

- Same inputs, same output, bit for bit, so the coordinator's journal can replay a run.
- ``merge`` may update ``model``'s tensors and ``state`` in place and return the model (the coordinator
  owns both and copies what it must keep). It never mutates ``update``, ``update.tensors`` or
  ``update.base``. Returning ``None`` means the model did not change at all; raising
  :class:`~vcasync.errors.UpdateRejectedError` (``reason=...``) refuses the result and changes nothing.
- The state holds only tensors, ints, floats, bools, strings, ``None`` and lists/dicts of those, so
  ``vcasync.wire.pack_tree`` checkpoints it and a restored state behaves identically.
- ``needs_base`` is True when the policy needs the model the worker started from (``Update.base``)
  to use a delta; the coordinator then fills it in, or refuses the result when that version is gone.
- ``claims`` names the optional laws the policy promises (see :data:`OPTIONAL_LAWS`); the laws in
  :data:`REQUIRED_LAWS` bind every policy.
- Integer and bool tensors (BatchNorm's ``num_batches_tracked``, masks) are never averaged or
  scaled. Integer tensors are *counters*: in every update, delta or full weights, they carry the
  worker's **increment**, its value minus the value of the version it trained from (a worker's
  delta is ``t - base`` for them too; the coordinator turns a full-weights result's integers into
  increments against its base version before any policy sees it). A merge adds the increments of
  every result it merges to the model's value, so sequential and concurrent work both count every
  step, and ``upload = "delta"`` and ``upload = "weights"`` give the same counters. The
  coordinator refuses an increment below zero or one that would wrap the counter past its
  dtype's maximum before any policy sees it, and unsigned integer tensors when it is built. Bool tensors
  carry the worker's **value** in both kinds; the last result merged wins (a buffering policy
  applies the last value it buffered). The ``counters`` law holds every policy to this.
- Running statistics (floating-point buffers such as BatchNorm's ``running_mean`` and
  ``running_var``: the names in ``ModelState.statistics``, which ``from_module`` fills) are not
  the policy's to merge: in a coordinator the policy sees what a result changes of them (to
  measure and judge it), but each new version's statistics are the element-wise median of the
  values carried by the results merged into it, whatever the policy made of them (see "Running
  statistics" in docs/policies.md). A policy fed directly sees them as any float tensor.
- ``flush`` (optional) is for a policy whose ``merge`` holds results back (a buffer): when the
  run's last result is merged, the coordinator calls it once to apply what the policy still holds,
  as one more version, so the final model includes every accepted result. It follows ``merge``'s
  rules (deterministic, None when it holds nothing, the state emptied of what it applied so a
  second ``flush`` returns None). The coordinator journals the flush as its own step, so a
  restart replays it exactly once. A policy that holds results and has no ``flush`` ends the run
  without them (the coordinator says so at WARNING).
- ``merge`` never changes the update's metadata either (``staleness``, ``samples``, ``steps``,
  ``metrics``, ...): the coordinator records and journals them after the merge.

Policies come from a registry fed by the ``vcasync.policies`` entry-point group (our built-ins use it
too) and by :func:`register_policy`. Each is validated when registered or first loaded: required
methods and attributes, and constructor parameters that are keyword-usable, typed and defaulted,
so :func:`build_policy` can reject unknown parameters and wrong types by name.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Final, Protocol, runtime_checkable

from ._params import ParamSpec, coerce_params, param_specs
from ._registry import Registry
from .errors import ConfigError, PluginValidationError, UnknownPolicyError, VCAsyncError
from .tensors import ModelState, Update

__all__ = [
    "KNOWN_LAWS",
    "OPTIONAL_LAWS",
    "REQUIRED_LAWS",
    "MergePolicy",
    "ParamSpec",
    "PolicySpec",
    "PolicyState",
    "available_policies",
    "build_policy",
    "policy_from_config",
    "policy_spec",
    "refresh_policies",
    "register_policy",
    "unregister_policy",
    "validate_policy",
]

#: Policy state: names -> tensors, ints, floats, bools, strings, None, or lists/dicts of those.
PolicyState = dict[str, Any]

#: Laws a policy may claim (``claims``): a result equal to the model leaves it unchanged; a merged
#: model lies in the element-wise hull of the model and the results merged into it; a staler result
#: never moves the model more; f outliers among a buffer cannot drag it outside the honest hull.
OPTIONAL_LAWS: Final = frozenset({"identity", "convex", "staleness_monotone", "bounded_influence"})
#: Laws every policy obeys: the contract above (None keeps the model, a rejection changes nothing,
#: the spec is preserved), bit-exact determinism, state round trip, inputs (tensors and metadata)
#: never mutated, finite in -> finite out, and the integer/bool rule (``counters``).
REQUIRED_LAWS: Final = frozenset({"contract", "deterministic", "state_roundtrip", "inputs_unchanged",
                                  "finite", "counters"})
KNOWN_LAWS: Final = OPTIONAL_LAWS | REQUIRED_LAWS

_GROUP: Final = "vcasync.policies"


@runtime_checkable
class MergePolicy(Protocol):
    """What the coordinator needs from a merge policy.

    ``needs_base`` and ``claims`` may be class attributes or per-instance values (a wrapper such as
    ``gate`` inherits them from the policy it wraps). A policy claiming ``bounded_influence`` also
    has an ``int`` attribute ``max_outliers``: how many outliers per buffer it withstands.
    """

    name: ClassVar[str]

    @property
    def needs_base(self) -> bool: ...

    @property
    def claims(self) -> frozenset[str]: ...

    def init_state(self, model: ModelState) -> PolicyState: ...

    def merge(self, model: ModelState, update: Update,
              state: PolicyState) -> ModelState | None: ...


@dataclass(frozen=True, slots=True)
class PolicySpec:
    """A validated policy class: its registered name, the class, and its constructor parameters."""

    name: str
    cls: type
    params: Mapping[str, ParamSpec]

    @property
    def summary(self) -> str:
        """The first line of the class docstring."""
        doc = inspect.getdoc(self.cls) or ""
        return doc.strip().splitlines()[0] if doc.strip() else ""

    def defaults(self) -> dict[str, Any]:
        return {n: p.default for n, p in self.params.items()}

    def build(self, params: Mapping[str, Any] | None = None) -> MergePolicy:
        """An instance built from ``params`` (checked by name and type first)."""
        kwargs = coerce_params(self.name, self.params, params or {})
        try:
            policy = self.cls(**kwargs)
        except VCAsyncError:
            raise                   # already says what is wrong (a ConfigError, an unknown inner policy)
        except (ValueError, TypeError) as exc:  # how a constructor refuses a parameter
            raise ConfigError(f"policy {self.name!r}: {exc}") from exc
        except Exception as exc:    # anything else may be a bug: say what and keep it as the cause
            raise ConfigError(f"policy {self.name!r} could not be built with {dict(kwargs)!r}: its "
                              f"constructor raised {type(exc).__name__}: {exc}") from exc
        validate_policy(policy, name=self.name)
        return policy  # type: ignore[no-any-return]


def _check_attr(plugin: str, owner: object, attr: str) -> None:
    static = inspect.getattr_static(owner, attr, None)
    if isinstance(static, property):
        return
    value = getattr(owner, attr, None)
    if attr == "needs_base" and not isinstance(value, bool):
        raise PluginValidationError("needs a bool attribute 'needs_base' (True when it needs "
                                    "Update.base to use a delta)", plugin=plugin)
    if attr == "claims":
        if not isinstance(value, frozenset) or not all(isinstance(c, str) for c in value):
            raise PluginValidationError("needs a frozenset[str] attribute 'claims' (the laws it "
                                        f"promises, among {sorted(OPTIONAL_LAWS)})", plugin=plugin)
        unknown = sorted(value - KNOWN_LAWS)
        if unknown:
            raise PluginValidationError(f"claims unknown law(s) {unknown}; known: "
                                        f"{sorted(KNOWN_LAWS)}", plugin=plugin)


#: The methods a policy has (or may have: ``flush``), with the arguments each must accept.
_METHODS: Final = (("init_state", "(self, model)", True), ("merge", "(self, model, update, state)", True),
                   ("flush", "(self, model, state)", False))


def _check_methods(plugin: str, owner: object, *, bound: bool) -> None:
    for meth, want, required in _METHODS:
        fn = getattr(owner, meth, None)
        if fn is None and not required:
            continue
        if not callable(fn):
            raise PluginValidationError(f"missing method {meth!r}" if fn is None else
                                        f"{meth!r} must be a method {want}", plugin=plugin)
        try:
            inspect.signature(fn).bind(*([None] * (want.count(",") + 1 - bound)))
        except TypeError:
            raise PluginValidationError(f"method {meth!r} must accept {want}",
                                        plugin=plugin) from None
        except ValueError:  # pragma: no cover - builtins without signatures
            pass


def _check_instance(plugin: str, policy: object) -> None:
    for attr in ("needs_base", "claims"):
        _check_attr(plugin, policy, attr)
        value = getattr(policy, attr)
        if attr == "needs_base" and not isinstance(value, bool):
            raise PluginValidationError("'needs_base' must be a bool", plugin=plugin)
        if attr == "claims" and not isinstance(value, frozenset):
            raise PluginValidationError("'claims' must be a frozenset", plugin=plugin)
    if "bounded_influence" in policy.claims:  # type: ignore[attr-defined]
        m = getattr(policy, "max_outliers", None)
        if not isinstance(m, int) or isinstance(m, bool) or m < 0:
            raise PluginValidationError("claims 'bounded_influence' but has no int attribute "
                                        "'max_outliers' >= 0", plugin=plugin)


def _validate(name: str, obj: object) -> PolicySpec:
    """The registry's validator: ``obj`` must be a policy class fit to build from config."""
    if not inspect.isclass(obj):
        raise PluginValidationError(f"must be a class, got {type(obj).__name__}", plugin=name)
    declared = getattr(obj, "name", None)
    if declared != name:
        raise PluginValidationError(f"class attribute 'name' is {declared!r}; it must equal the "
                                    f"registered name", plugin=name)
    for attr in ("needs_base", "claims"):
        if inspect.getattr_static(obj, attr, None) is None:
            raise PluginValidationError(f"missing attribute {attr!r}", plugin=name)
        _check_attr(name, obj, attr)
    _check_methods(name, obj, bound=False)
    return PolicySpec(name, obj, param_specs(name, obj))


def validate_policy(policy: object, *, name: str | None = None) -> None:
    """Check a built policy as the registry checks every policy it builds.

    ``policy`` needs ``init_state(model)`` and ``merge(model, update, state)`` (and, if it has
    one, ``flush(model, state)``), a bool
    ``needs_base``, a frozenset ``claims`` of known laws, and an int ``max_outliers`` >= 0 when it
    claims ``bounded_influence``. Raises :class:`PluginValidationError` naming the policy (``name``,
    else its ``name`` attribute, else its type) and the problem. ``vcasync.testing.check_policy``
    runs it before any law.
    """
    declared = getattr(policy, "name", None)
    plugin = name if name is not None else declared if isinstance(declared, str) else type(policy).__name__
    _check_methods(plugin, policy, bound=True)
    _check_instance(plugin, policy)


def _missing(name: str, path: str, exc: ImportError) -> Exception:
    return PluginValidationError(f"cannot import {path} ({exc}); is the package that provides "
                                 f"it (and its dependencies) installed?", plugin=name)


def _broken(name: str, problem: str) -> Exception:
    return PluginValidationError(problem, plugin=name)


def _unknown(name: str, names: list[str]) -> Exception:
    return UnknownPolicyError(f"no merge policy named {name!r}; available: {', '.join(names)}")


_POLICIES: Final = Registry[PolicySpec](_GROUP, validate=_validate, missing=_missing,
                                        unknown=_unknown, broken=_broken)


def register_policy(name: str, cls: type, *, replace: bool = False) -> PolicySpec:
    """Validate ``cls`` and register it as ``name`` (overriding an existing one needs ``replace``)."""
    if not replace and name in _POLICIES:
        raise PluginValidationError("a policy with this name is already registered (pass "
                                    "replace=True to override it)", plugin=name)
    return _POLICIES.register(name, cls, replace=True)


def unregister_policy(name: str) -> None:
    """Forget an explicitly registered policy (entry points stay discoverable)."""
    _POLICIES.unregister(name)


def refresh_policies() -> None:
    """Forget the cached entry-point list, so packages installed since are discovered."""
    _POLICIES.refresh()


def available_policies() -> list[str]:
    """Sorted names of every policy: entry points plus explicit registrations."""
    return _POLICIES.names()


def policy_spec(name: str) -> PolicySpec:
    """The validated spec of ``name`` (loading its entry point); :class:`UnknownPolicyError`."""
    if not isinstance(name, str):
        raise ConfigError(f"a policy name must be a string, got {type(name).__name__}")
    return _POLICIES.get(name)


def build_policy(name: str, params: Mapping[str, Any] | None = None) -> MergePolicy:
    """Build policy ``name`` with ``params``; unknown parameters raise :class:`ConfigError`."""
    return policy_spec(name).build(params)


_TABLE_KEYS: Final = frozenset({"name", "params"})


def policy_from_config(table: Mapping[str, Any]) -> MergePolicy:
    """Build a policy from a parsed TOML table.

    Accepted shapes (``table`` may be the whole file or the ``[policy]`` table itself)::

        policy = "vcasgd"                 # name only, default parameters

        [policy]                          # name and parameters
        name = "vcasgd"
        [policy.params]
        alpha = 0.6
    """
    if not isinstance(table, Mapping):
        raise ConfigError(f"policy config must be a table, got {type(table).__name__}")
    section: Any = table.get("policy", table)
    if isinstance(section, str):
        return build_policy(section)
    if not isinstance(section, Mapping):
        raise ConfigError(f"'policy' must be a name or a table, got {type(section).__name__}")
    unknown = sorted(str(k) for k in section if k not in _TABLE_KEYS)
    if unknown:
        raise ConfigError(f"unknown key(s) in the policy table: {', '.join(unknown)} "
                          f"(it takes: name, params)")
    if "name" not in section:
        raise ConfigError("the policy table needs a 'name' (e.g. name = \"vcasgd\")")
    params = section.get("params", {})
    if not isinstance(params, Mapping):
        raise ConfigError(f"'policy.params' must be a table, got {type(params).__name__}")
    return build_policy(section["name"], params)
