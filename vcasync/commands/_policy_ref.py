"""``--policy module:Class``: a merge policy of one's own, used by ``vcasync coordinator`` without a
package or an entry point.

The class is imported as a model factory is (``--app-dir`` first, then ``sys.path``: the current
directory and ``PYTHONPATH``), validated as an installed policy is, and registered under its ``name``
attribute, which the run records: a restart with the same ``--policy`` continues the run.
"""

from __future__ import annotations

import inspect
from pathlib import Path

from ..errors import ConfigError

__all__ = ["is_policy_ref", "resolve_policy_name"]


def is_policy_ref(value: object) -> bool:
    """Whether a ``--policy`` value (or run.toml's ``[policy] name``) is a ``module:Class``
    reference rather than a registered name."""
    return isinstance(value, str) and ":" in value


def resolve_policy_name(ref: object, *, app_dir: Path | None = None) -> object:
    """The registered name ``ref`` stands for: a name (or anything but a ``module:Class`` string) as
    it is; ``module:Class`` imported, validated and registered under the class's ``name``.

    A :class:`ConfigError` names ``ref`` and the problem: it cannot be imported, it is not a class,
    its ``name`` is not a plain name, it takes the name of another registered policy, or it fails the
    policy checks (:class:`~vcasync.errors.PluginValidationError`, a ``ConfigError``)."""
    if not is_policy_ref(ref):
        return ref
    assert isinstance(ref, str)
    from .._imports import import_object
    from ..policy import available_policies, policy_spec, register_policy

    obj = import_object(ref, what="policy", app_dir=app_dir)
    if not inspect.isclass(obj):
        raise ConfigError(f"policy {ref!r} is a {type(obj).__name__}, not a class: --policy "
                          "module:Class names a merge-policy class (see docs/policies.md)")
    name = getattr(obj, "name", None)
    if not isinstance(name, str) or not name.strip() or ":" in name or name != name.strip():
        raise ConfigError(f"policy {ref!r}: its class attribute 'name' must be the policy's name, a "
                          f"non-empty string without ':' (the run records it), got {name!r}")
    if name in available_policies():
        try:
            held = policy_spec(name).cls
        except Exception:       # a broken plugin of that name: still not this class's name to take
            held = None
        if held is obj:
            return name
        raise ConfigError(f"policy {ref!r} is named {name!r}, the name of another registered policy"
                          f"{'' if held is None else f' ({held.__module__}.{held.__qualname__})'}: "
                          "give your class a name of its own")
    register_policy(name, obj)
    return name
