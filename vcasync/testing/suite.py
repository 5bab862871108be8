"""Hypothesis-driven law checks: ``check_policy`` and one ``check_<law>`` per law.

Typical use, in a test of your own policy::

    from vcasync.testing import check_policy

    def test_my_policy_obeys_its_laws():
        check_policy(lambda: MyPolicy(alpha=0.3))

``check_policy`` builds one policy to read its ``claims``, then runs every required law and every
claimed one (:mod:`vcasync.testing.laws` explains each) on ``max_examples`` drawn examples, and
returns the names of the laws it ran. Each law is also a function of its own (``check_convex``,
...), and ``laws=[...]`` picks a subset. ``models`` replaces the model strategy (e.g. to restrict
dtypes); ``settings`` replaces the hypothesis settings entirely; ``window`` is the staleness the
coordinator will feed the policy (``max_staleness``, 16 by default): most draws stay within it,
and a wide tail goes far beyond (up to 2**40).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from hypothesis import HealthCheck, given
from hypothesis import settings as Settings
from hypothesis import strategies as st
from hypothesis.errors import HypothesisException

from ..errors import ConfigError
from ..policy import KNOWN_LAWS, REQUIRED_LAWS, validate_policy
from ..tensors import ModelState
from . import laws as _laws
from .policy_run import LawViolation, PolicyFactory
from .strategies import DEFAULT_WINDOW, TAIL_MAX, UpdateStream, staleness_values, update_streams

__all__ = [
    "LAW_CHECKS",
    "check_bounded_influence",
    "check_contract",
    "check_convex",
    "check_counters",
    "check_deterministic",
    "check_finite",
    "check_identity",
    "check_inputs_unchanged",
    "check_law",
    "check_policy",
    "check_staleness_monotone",
    "check_state_roundtrip",
]

Models = st.SearchStrategy[ModelState] | None


def _settings(max_examples: int, override: Settings | None) -> Settings:
    if override is not None:
        return override
    return Settings(max_examples=max_examples, deadline=None, print_blob=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _check_factory(factory: object) -> None:
    if not callable(factory):
        raise ConfigError(f"a policy factory must be callable (a class, a lambda, a partial), got "
                          f"{type(factory).__name__} {factory!r}: pass the class, not an instance")


def _drive(law: str, factory: PolicyFactory, strategy: st.SearchStrategy[Any],
           body: Callable[[Any], None], max_examples: int, override: Settings | None) -> None:
    _check_factory(factory)
    if override is None and (not isinstance(max_examples, int) or max_examples < 1):
        raise ConfigError(f"max_examples must be an int >= 1, got {max_examples!r}")

    @_settings(max_examples, override)
    @given(strategy)
    def run(example: Any) -> None:
        try:
            body(example)
        except (LawViolation, HypothesisException):
            raise
        except Exception as exc:  # the policy under test failed: a breach, named like any other
            raise LawViolation(law, f"policy {factory!r} raised {type(exc).__name__}: {exc} (only "
                                    f"UpdateRejectedError may leave a policy)") from exc

    run()


def _streams(models: Models, *, allow_nan: bool, kinds: tuple[str, ...] = ("delta", "weights"),
             window: int = DEFAULT_WINDOW) -> st.SearchStrategy[UpdateStream]:
    if not isinstance(window, int) or isinstance(window, bool) or window < 0:
        raise ConfigError(f"window (the coordinator's max_staleness) must be an int >= 0, got {window!r}")
    return update_streams(models=models, allow_nan=allow_nan, kinds=kinds,  # type: ignore[arg-type]
                          window=window)


def check_contract(factory: PolicyFactory, *, max_examples: int = 30, models: Models = None,
                   settings: Settings | None = None, window: int = DEFAULT_WINDOW) -> None:
    """None keeps the model; refusals change nothing; spec kept; state serialises (NaN/Inf too)."""
    _drive("contract", factory, _streams(models, allow_nan=True, window=window),
           lambda s: _laws.contract(factory, s), max_examples, settings)


def check_inputs_unchanged(factory: PolicyFactory, *, max_examples: int = 30, models: Models = None,
                           settings: Settings | None = None, window: int = DEFAULT_WINDOW) -> None:
    """``update.tensors``, ``update.base`` and the update's metadata never change (NaN/Inf too)."""
    _drive("inputs_unchanged", factory, _streams(models, allow_nan=True, window=window),
           lambda s: _laws.inputs_unchanged(factory, s), max_examples, settings)


def check_deterministic(factory: PolicyFactory, *, max_examples: int = 30, models: Models = None,
                        settings: Settings | None = None, window: int = DEFAULT_WINDOW) -> None:
    """The same stream twice gives the same bits (NaN/Inf included)."""
    _drive("deterministic", factory, _streams(models, allow_nan=True, window=window),
           lambda s: _laws.deterministic(factory, s), max_examples, settings)


def check_state_roundtrip(factory: PolicyFactory, *, max_examples: int = 30, models: Models = None,
                          settings: Settings | None = None, window: int = DEFAULT_WINDOW) -> None:
    """A state restored through the wire mid-stream continues exactly as the original."""
    strategy = st.tuples(_streams(models, allow_nan=True, window=window), st.integers(0, 8))
    _drive("state_roundtrip", factory, strategy, lambda e: _laws.state_roundtrip(factory, e[0], e[1]),
           max_examples, settings)


def check_finite(factory: PolicyFactory, *, max_examples: int = 30, models: Models = None,
                 settings: Settings | None = None, window: int = DEFAULT_WINDOW) -> None:
    """Finite in, finite out."""
    _drive("finite", factory, _streams(models, allow_nan=False, window=window),
           lambda s: _laws.finite(factory, s), max_examples, settings)


def check_identity(factory: PolicyFactory, *, max_examples: int = 30, models: Models = None,
                   settings: Settings | None = None, window: int = DEFAULT_WINDOW) -> None:
    """Results equal to the model leave it unchanged."""
    _drive("identity", factory, _streams(models, allow_nan=False, window=window),
           lambda s: _laws.identity(factory, s), max_examples, settings)


def check_convex(factory: PolicyFactory, *, max_examples: int = 30, models: Models = None,
                 settings: Settings | None = None, window: int = DEFAULT_WINDOW,
                 ulps: int = _laws.DEFAULT_ULPS) -> None:
    """Merged models stay in the element-wise hull of the model and the merged results."""
    _drive("convex", factory, _streams(models, allow_nan=False, window=window),
           lambda s: _laws.convex(factory, s, ulps=ulps), max_examples, settings)


def check_staleness_monotone(factory: PolicyFactory, *, max_examples: int = 30,
                             models: Models = None, settings: Settings | None = None,
                             window: int = DEFAULT_WINDOW,
                             ulps: int = _laws.DEFAULT_ULPS) -> None:
    """A staler copy of a result never moves the model more."""
    gaps = st.one_of(st.integers(1, 10), st.integers(1, TAIL_MAX))
    strategy = st.tuples(_streams(models, allow_nan=False, window=window),
                         staleness_values(window), gaps)
    _drive("staleness_monotone", factory, strategy,
           lambda e: _laws.staleness_monotone(factory, e[0], e[1], e[1] + e[2], ulps=ulps),
           max_examples, settings)


def check_bounded_influence(factory: PolicyFactory, *, max_examples: int = 30,
                            models: Models = None, settings: Settings | None = None,
                            window: int = DEFAULT_WINDOW,
                            ulps: int = _laws.DEFAULT_ULPS) -> None:
    """``max_outliers`` hostile results cannot drag the model outside the honest hull."""
    strategy = st.tuples(_streams(models, allow_nan=False, kinds=("delta",), window=window),
                         st.lists(st.integers(0, 63), min_size=0, max_size=8))
    _drive("bounded_influence", factory, strategy,
           lambda e: _laws.bounded_influence(factory, e[0], e[1], ulps=ulps), max_examples, settings)


def check_counters(factory: PolicyFactory, *, max_examples: int = 30, models: Models = None,
                   settings: Settings | None = None, window: int = DEFAULT_WINDOW) -> None:
    """Integer tensors add every merged increment; bools take the last merged value."""
    _drive("counters", factory, _streams(models, allow_nan=True, window=window),
           lambda s: _laws.counters(factory, s), max_examples, settings)


LAW_CHECKS: dict[str, Callable[..., None]] = {
    "contract": check_contract,
    "inputs_unchanged": check_inputs_unchanged,
    "deterministic": check_deterministic,
    "state_roundtrip": check_state_roundtrip,
    "finite": check_finite,
    "identity": check_identity,
    "convex": check_convex,
    "staleness_monotone": check_staleness_monotone,
    "bounded_influence": check_bounded_influence,
    "counters": check_counters,
}
if set(LAW_CHECKS) != KNOWN_LAWS:  # pragma: no cover - a law added to vcasync.policy without a check
    raise ImportError("vcasync.testing.suite does not cover every law in vcasync.policy.KNOWN_LAWS")


def _law_names(laws: Iterable[str]) -> list[str]:
    if isinstance(laws, str | bytes) or not isinstance(laws, Iterable):
        raise ConfigError(f"laws must be a list of law names, got {type(laws).__name__} {laws!r}")
    chosen = list(laws)
    unknown = [law for law in chosen if law not in LAW_CHECKS]
    if unknown:
        raise ConfigError(f"unknown law(s) {unknown}; known: {sorted(LAW_CHECKS)}")
    return chosen


def check_law(law: str, factory: PolicyFactory, **options: Any) -> None:
    """Run one law by name (``options`` as for its ``check_<law>`` function)."""
    if not isinstance(law, str):
        raise ConfigError(f"a law is named by a string, got {type(law).__name__} {law!r}")
    _law_names([law])
    LAW_CHECKS[law](factory, **options)


def check_policy(factory: PolicyFactory, *, laws: Iterable[str] | None = None,
                 max_examples: int = 30, models: Models = None,
                 settings: Settings | None = None, window: int = DEFAULT_WINDOW) -> list[str]:
    """Run the required laws and every law the policy claims; returns the names run, in order.

    ``laws`` restricts the run to those names (a law the policy does not claim may be asked for).
    The policy is first checked as the registry checks every policy it builds
    (:func:`vcasync.policy.validate_policy`: :class:`~vcasync.errors.PluginValidationError`).
    """
    _check_factory(factory)
    policy = factory()
    validate_policy(policy)
    chosen = sorted(REQUIRED_LAWS | policy.claims) if laws is None else _law_names(laws)
    for law in chosen:
        LAW_CHECKS[law](factory, max_examples=max_examples, models=models, settings=settings,
                        window=window)
    return chosen
