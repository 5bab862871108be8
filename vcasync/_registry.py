"""A small registry of named plugins fed by an entry-point group.

Built-ins register through the same entry-point groups third parties use (see pyproject.toml), so
ours get no special path. Entries load lazily; a validator runs when an entry is registered or first
loaded, and a missing optional dependency turns into an error with the install hint.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from importlib.metadata import EntryPoint, entry_points
from typing import Generic, TypeVar

T = TypeVar("T")

__all__ = ["Registry"]


class Registry(Generic[T]):
    """Names -> plugins of one kind, from ``group`` entry points plus explicit ``register`` calls."""

    def __init__(self, group: str, *, validate: Callable[[str, object], T],
                 missing: Callable[[str, str, ImportError], Exception],
                 unknown: Callable[[str, list[str]], Exception],
                 broken: Callable[[str, str], Exception],
                 duplicate: Callable[[str], Exception] | None = None) -> None:
        self.group = group
        self._validate = validate
        self._missing = missing
        self._unknown = unknown
        self._duplicate = duplicate
        #: (name, what is wrong) -> the error for a plugin that cannot load: its import raised
        #: something else than ImportError, it names no such object, or two packages declare it
        self._broken = broken
        self._loaded: dict[str, T] = {}
        self._paths: dict[str, str] | None = None
        #: name -> every entry point of that name, when installed packages give it more than one
        self._clashes: dict[str, list[EntryPoint]] = {}

    def _entry_points(self) -> dict[str, str]:
        if self._paths is None:
            found: dict[str, list[EntryPoint]] = {}
            for ep in entry_points(group=self.group):
                same = found.setdefault(ep.name, [])
                if all(other.value != ep.value for other in same):
                    same.append(ep)
            self._paths = {name: eps[0].value for name, eps in found.items()}
            self._clashes = {name: eps for name, eps in found.items() if len(eps) > 1}
        return self._paths

    def register(self, name: str, obj: object, *, replace: bool = False) -> T:
        """Validate and register ``obj`` under ``name``; returns it (validated). A name already
        taken, by a registration or by an installed entry point (a built-in), needs ``replace``."""
        if not replace and (name in self._loaded or name in self._entry_points()):
            if self._duplicate is not None:
                raise self._duplicate(name)
            raise self._unknown(f"{name!r} is already registered in {self.group}", [])
        checked = self._validate(name, obj)
        self._loaded[name] = checked
        return checked

    def unregister(self, name: str) -> None:
        self._loaded.pop(name, None)

    def refresh(self) -> None:
        """Forget the cached entry-point list, so packages installed since are discovered."""
        self._paths = None

    def names(self) -> list[str]:
        return sorted(set(self._loaded) | set(self._entry_points()))

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self.names()

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def get(self, name: str) -> T:
        """The plugin called ``name``; the registry's ``unknown`` error for any other name (and for
        a value that is not a string at all, such as a hostile payload's)."""
        if not isinstance(name, str):
            raise self._unknown(name, self.names())
        if name in self._loaded:
            return self._loaded[name]
        path = self._entry_points().get(name)
        if path is None:
            raise self._unknown(name, self.names())
        clash = self._clashes.get(name)
        if clash is not None:
            # which one entry_points() yields first depends on how the packages were installed:
            # taking it would pick a plugin by accident (and maybe another one after a reinstall)
            providers = ", ".join(f"{_dist_name(ep)} ({ep.value})" for ep in clash)
            raise self._broken(name, f"{len(clash)} installed packages provide it under this "
                                     f"name: {providers}; uninstall all but one, or give the "
                                     f"others' entry points names of their own")
        for ep in entry_points(group=self.group, name=name):
            try:
                obj = ep.load()
            except ImportError as exc:
                raise self._missing(name, path, exc) from exc
            except Exception as exc:  # the plugin's own code failed, or it names no such object
                raise self._broken(name, f"cannot load {path}: {type(exc).__name__}: {exc}"
                                   ) from exc
            checked = self._validate(name, obj)
            self._loaded[name] = checked
            return checked
        raise self._unknown(name, self.names())  # pragma: no cover - entry point vanished


def _dist_name(ep: EntryPoint) -> str:
    """The name of the installed package that declares ``ep`` (``?`` when unknown)."""
    dist = getattr(ep, "dist", None)
    name = getattr(dist, "name", None) if dist is not None else None
    return name if isinstance(name, str) else "?"
