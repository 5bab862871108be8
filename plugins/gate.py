"""A gate that wraps any policy and refuses results whose norm or direction is an outlier.

In the spirit of the norm-bounding and cosine-similarity defences against poisoned updates:
Sun, Kairouz, Suresh, McMahan, *Can You Really Backdoor Federated Learning?*, 2019 (arXiv 1911.07963)
(norm difference clipping/bounding) and Fung, Yoon, Beschastnikh, *The Limitations of Federated
Learning in Sybil Settings* (FoolsGold), RAID 2020 (arXiv 1808.04866) (cosine similarity).

For each result the gate takes its delta ``d`` (the delta itself; for full weights ``w_c - w_base``
when the base is known, else ``w_c - w``) over the floating-point tensors and measures ``|d|`` and
``cos(d, r)`` against a running reference direction ``r`` (an exponential moving average of the
accepted deltas). It refuses, with :class:`~vcasync.errors.UpdateRejectedError`:

- ``reason="non_finite"``: ``d`` holds NaN or Inf (always, warm-up or not);
- ``reason="norm_outlier"``: ``|d|`` overflows or exceeds ``max_norm`` (always); or, judged
  against its **peers** (the accepted results on the same base version, once there are ``warmup``
  of them), lies above their mean by more than ``z`` of their standard deviations (the spread is
  floored at 5 % of the mean, so a run of equal norms does not make every slightly larger one an
  outlier); or, with fewer peers, against the **running** statistics of every accepted result
  (exponentially weighted, ``decay``) the same way, once ``warmup`` were accepted; except that
  behind a policy that holds results back (a ``buffer_size`` above 1) a result with fewer peers
  is judged against the **nearby** results instead (its version's and the nearest versions' in
  the window, pooled until there are ``warmup``) and refused only above ``max_ratio`` times their
  mean;
- ``reason="direction_outlier"``: ``cos < min_cosine`` (always); or below its peers' (or the
  running) mean cosine by more than ``z`` of their standard deviations (the spread floored at
  0.1); behind a buffering policy with fewer peers, negative and that far below the nearby
  results' mean (a result has no cosine while ``r`` is zero).

The statistics are kept per base version too, for the ``window`` newest base versions accepted
(older ones are dropped), so a result is compared with results trained from the same model where
there are enough of them. A gate that judged every result by the running statistics (until
2026-12-08) locked honest fleets out behind a buffering policy: on ``fedbuff`` the results on
version 1 had norms 2.5 times those on version 0, and every one was refused. Behind a policy that
publishes a version per result (``vcasgd``, ``fedasync``) the running statistics follow the model
closely and are kept: the coarse nearby checks let a result 10 times an honest norm through.
Only accepted results update the statistics, so an attacker cannot drag them. Everything the gate
keeps is in its state (the running statistics, counts and sums per version, ``r`` and ``r.r``,
carried forward from the sums each merge measures, so that measuring a result reads ``r`` once)
next to the wrapped policy's; norms and dot products are summed over fixed 16 Ki rows, the rows
exactly, so the decisions do not depend on the thread count. A state saved before the statistics
were kept per version loads: it has no per-version statistics yet, and its running ones go on.
``needs_base`` and the claims come from the wrapped policy, and ``flush`` (the end of the run) is
the wrapped policy's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar

import torch

from vcasync.errors import ConfigError, UnknownPolicyError, UpdateRejectedError
from vcasync.policy import MergePolicy, PolicyState, build_policy
from vcasync.tensors import ModelState, Update, all_finite

from ._bounds import MAX_GATE_WINDOW, MAX_WARMUP, at_most
from ._kernels import Workspace, check_update, delta_of, dot2, mixable, sumsq

__all__ = ["Gate"]

_MIN_SPREAD = 0.05  # of the mean norm
_MIN_COS_SPREAD = 0.1


class Gate:
    """Wraps a policy (by name and params) and refuses results whose norm or cosine is an outlier."""

    name: ClassVar[str] = "gate"

    def __init__(self, inner: str = "vcasgd", inner_params: dict[str, Any] | None = None,
                 z: float = 3.0, warmup: int = 5, decay: float = 0.9, max_norm: float | None = None,
                 min_cosine: float | None = None, window: int = 16, max_ratio: float = 10.0) -> None:
        if inner == "gate":
            raise ConfigError("gate: a gate cannot wrap another gate")
        if not 0.0 < z < float("inf"):
            raise ConfigError(f"gate: z must be positive and finite, got {z}")
        if warmup < 0:
            raise ConfigError(f"gate: warmup must be >= 0, got {warmup}")
        at_most("gate", "warmup", warmup, MAX_WARMUP,
                "a warm-up no run ends switches the statistical checks off")
        if window < 1:
            raise ConfigError(f"gate: window must be >= 1, got {window}")
        at_most("gate", "window", window, MAX_GATE_WINDOW,
                "the state keeps the statistics of every base version in the window")
        if not 1.0 < max_ratio < float("inf"):
            raise ConfigError(f"gate: max_ratio must be above 1 and finite, got {max_ratio}")
        if not 0.0 < decay < 1.0:
            raise ConfigError(f"gate: decay must be in (0, 1), got {decay}")
        if max_norm is not None and not max_norm > 0.0:
            raise ConfigError(f"gate: max_norm must be positive, got {max_norm}")
        if min_cosine is not None and not -1.0 <= min_cosine <= 1.0:
            raise ConfigError(f"gate: min_cosine must be in [-1, 1], got {min_cosine}")
        self.inner: MergePolicy = _build_inner(inner, inner_params)
        self.z, self.warmup, self.decay = z, warmup, decay
        self.max_norm, self.min_cosine = max_norm, min_cosine
        self.window, self.max_ratio = window, max_ratio
        #: The wrapped policy holds results back (a ``buffer_size`` above 1: ``fedbuff``, ``sync``,
        #: ``median``, ``trimmed_mean``, a buffered ``diloco``), so a version is many results away
        #: from the one before it.
        self.buffering = int(getattr(self.inner, "buffer_size", 1) or 1) > 1
        self._ws = Workspace()

    @property
    def needs_base(self) -> bool:
        """The wrapped policy's."""
        return self.inner.needs_base

    @property
    def claims(self) -> frozenset[str]:
        """The wrapped policy's, less bounded influence (its check counts on every honest result
        being merged, and a gate may refuse one)."""
        return self.inner.claims - {"bounded_influence"}

    def __repr__(self) -> str:
        return (f"Gate({self.inner!r}, z={self.z}, warmup={self.warmup}, decay={self.decay}, "
                f"max_norm={self.max_norm}, min_cosine={self.min_cosine}, window={self.window}, "
                f"max_ratio={self.max_ratio})")

    def init_state(self, model: ModelState) -> PolicyState:
        return {
            "inner": self.inner.init_state(model),
            "accepted": 0, "cos_seen": 0, "versions": {},
            "norm_mean": 0.0, "norm_var": 0.0, "cos_mean": 0.0, "cos_var": 0.0,
            "ref": {n: torch.zeros(t.shape, dtype=t.dtype) for n, t in model.items() if mixable(t)},
            "ref_sq": 0.0,
        }

    def measure(self, model: ModelState, update: Update, ref: Mapping[str, torch.Tensor],
                ref_sq: float | None = None) -> tuple[float, float | None]:
        """``(|d|, cos(d, ref))`` of a result; the cosine is None while either vector is zero.

        ``ref_sq`` is ``ref.ref`` when the caller keeps it (the gate's state does, so a merge reads
        the reference once); None sums it. The norm is NaN when the result holds NaN or Inf, and
        Inf when it is finite but too large to measure (its squares overflow).
        """
        return self._norm_cos(update, ref, *self._dots(model, update, ref, ref_sq))

    def _dots(self, model: ModelState, update: Update, ref: Mapping[str, torch.Tensor],
              ref_sq: float | None) -> tuple[float, float, float]:
        """``(d.d, d.r, r.r)`` over the floating-point tensors."""
        dd = dr = 0.0
        for name, r in ref.items():
            a, b = dot2(update.tensors[name], r, self._ws, x_minus=self._minus(model, update, name))
            dd, dr = dd + a, dr + b
        rr = math.fsum(sumsq(r) for r in ref.values()) if ref_sq is None else ref_sq
        return dd, dr, rr

    @staticmethod
    def _norm_cos(update: Update, ref: Mapping[str, torch.Tensor], dd: float, dr: float,
                  rr: float) -> tuple[float, float | None]:
        if not (math.isfinite(dd) and math.isfinite(dr)):
            finite = all(all_finite(update.tensors[n]) for n in ref)
            return (math.inf if finite else math.nan), None
        norm = math.sqrt(dd)
        if dd == 0.0 or rr == 0.0:
            return norm, None
        return norm, max(-1.0, min(1.0, dr / math.sqrt(dd * rr)))

    @staticmethod
    def _minus(model: ModelState, update: Update, name: str) -> torch.Tensor | None:
        if update.kind == "delta":
            return None
        return update.base[name] if update.base is not None else model[name]

    def _decide(self, state: PolicyState, version: int, norm: float, cos: float | None) -> None:
        if math.isnan(norm):
            raise UpdateRejectedError("the result holds NaN or Inf", reason="non_finite")
        if math.isinf(norm):
            raise UpdateRejectedError("the result is too large to measure (its norm overflows)",
                                      reason="norm_outlier")
        if self.max_norm is not None and norm > self.max_norm:
            raise UpdateRejectedError(f"delta norm {norm:.4g} exceeds max_norm {self.max_norm:.4g}",
                                      reason="norm_outlier")
        if cos is not None and self.min_cosine is not None and cos < self.min_cosine:
            raise UpdateRejectedError(f"cosine {cos:.3f} to the running reference is below "
                                      f"min_cosine {self.min_cosine}", reason="direction_outlier")
        versions: dict[str, dict[str, Any]] = state.get("versions", {})
        need = max(self.warmup, 1)
        own = versions.get(str(version))
        if own is not None and int(own["n"]) >= need:
            self._against_peers(version, own, norm, cos)
            return
        if not self.buffering:
            # a version per result: the running statistics follow the model closely (a scaled,
            # flipped or random result stays refused, as tests/security shows)
            self._against_running(state, norm, cos)
            return
        # behind a policy that holds results back a new version may be far from the last one
        # (fedbuff's version 1: norms 2.5x version 0's): only the coarse checks
        nearby = _pool(versions, version, need)
        if int(nearby["n"]) >= need:
            self._against_nearby(version, nearby, norm, cos)

    def _against_running(self, state: PolicyState, norm: float, cos: float | None) -> None:
        """The z-spread checks against the exponentially weighted statistics of every accepted
        result (``decay``), once ``warmup`` were accepted."""
        if int(state["accepted"]) < self.warmup or "norm_mean" not in state:
            return
        cos_ready = int(state["cos_seen"]) >= self.warmup
        self._z_checks(norm, cos, float(state["norm_mean"]), math.sqrt(float(state["norm_var"])),
                       float(state["cos_mean"]) if cos_ready else None,
                       math.sqrt(float(state["cos_var"])) if cos_ready else 0.0, "its running mean", "")

    def _against_peers(self, version: int, peers: Mapping[str, Any], norm: float,
                       cos: float | None) -> None:
        """The z-spread checks against the accepted results on the same base version."""
        cos_ready = int(peers["cos_n"]) >= max(self.warmup, 1)
        self._z_checks(norm, cos, float(peers["norm_mean"]), _spread(peers, "norm"),
                       float(peers["cos_mean"]) if cos_ready else None, _spread(peers, "cos"),
                       "the mean", f" of the {int(peers['n'])} accepted results on its base version "
                       f"{version}")

    def _z_checks(self, norm: float, cos: float | None, mean: float, spread: float,
                  cmean: float | None, cspread: float, what: str, of: str) -> None:
        """A norm more than ``z`` spreads above ``mean`` (the spread floored at 5 % of it), or a
        cosine more than ``z`` spreads below ``cmean`` (floored at 0.1; None: no cosine check);
        the refusal says "above {what} {mean}{of}"."""
        spread = max(spread, _MIN_SPREAD * mean)
        if norm > mean + self.z * spread:
            raise UpdateRejectedError(
                f"delta norm {norm:.4g} is more than {self.z} spreads above {what} {mean:.4g}{of} "
                f"(spread {spread:.4g})", reason="norm_outlier")
        if cos is not None and cmean is not None:
            cspread = max(cspread, _MIN_COS_SPREAD)
            if cos < cmean - self.z * cspread:
                raise UpdateRejectedError(
                    f"cosine {cos:.3f} to the running reference is more than {self.z} spreads "
                    f"below {what} {cmean:.3f}{of}", reason="direction_outlier")

    def _against_nearby(self, version: int, nearby: Mapping[str, Any], norm: float,
                        cos: float | None) -> None:
        """The coarse checks against the accepted results on the nearest base versions (pooled):
        the model may have moved since, so only a result far outside them is refused."""
        mean = float(nearby["norm_mean"])
        if norm > self.max_ratio * mean:
            raise UpdateRejectedError(
                f"delta norm {norm:.4g} is more than {self.max_ratio:g} times the mean {mean:.4g} "
                f"of the {int(nearby['n'])} accepted results on the base versions nearest "
                f"{version}", reason="norm_outlier")
        if cos is not None and int(nearby["cos_n"]) >= max(self.warmup, 1):
            cmean = float(nearby["cos_mean"])
            bound = min(0.0, cmean - self.z * max(_spread(nearby, "cos"), _MIN_COS_SPREAD))
            if cos < bound:
                raise UpdateRejectedError(
                    f"cosine {cos:.3f} to the running reference is negative and more than {self.z} "
                    f"spreads below the mean {cmean:.3f} of the accepted results on the base "
                    f"versions nearest {version}", reason="direction_outlier")

    def merge(self, model: ModelState, update: Update, state: PolicyState) -> ModelState | None:
        check_update(model, update, needs_base=self.needs_base)
        ref: dict[str, torch.Tensor] = state["ref"]
        # ``ref_sq`` is absent from the state of a checkpoint written before it was kept.
        dd, dr, rr = self._dots(model, update, ref, state.get("ref_sq"))
        norm, cos = self._norm_cos(update, ref, dd, dr, rr)
        self._decide(state, update.base_version, norm, cos)
        # Accepted: fold d into the reference before the wrapped policy changes the model (a full
        # weights result without a base is measured against the model as it is now).
        rate = 1.0 - self.decay
        for name, r in ref.items():
            x, minus = update.tensors[name], self._minus(model, update, name)
            r.lerp_(x if minus is None else delta_of(x, minus, self._ws), rate)
        # r' = (1 - rate) r + rate d, so r'.r' follows from the sums just measured without reading
        # r again. The lerp's rounding makes it differ from a fresh sum by ~1e-7 relative (float32;
        # ~1e-5 for half tensors), and the difference shrinks by (1 - rate)^2 at every merge
        # instead of adding up.
        state["ref_sq"] = max(0.0, (1.0 - rate) ** 2 * rr + 2.0 * rate * (1.0 - rate) * dr
                              + rate * rate * dd)
        self._count(state, update.base_version, norm, cos)
        return self.inner.merge(model, update, state["inner"])

    def _count(self, state: PolicyState, version: int, norm: float, cos: float | None) -> None:
        """Add an accepted result to the running statistics and to its base version's; keep the
        ``window`` newest base versions."""
        first = int(state["accepted"]) == 0 or "norm_mean" not in state
        _ew_update(state, "norm", norm, self.decay, first=first)
        if cos is not None:
            _ew_update(state, "cos", cos, self.decay,
                       first=int(state["cos_seen"]) == 0 or "cos_mean" not in state)
        versions: dict[str, dict[str, Any]] = state.setdefault("versions", {})
        stats = versions.setdefault(str(version), {"n": 0, "norm_mean": 0.0, "norm_m2": 0.0,
                                                   "cos_n": 0, "cos_mean": 0.0, "cos_m2": 0.0})
        _welford(stats, "n", "norm", norm)
        state["accepted"] = int(state["accepted"]) + 1
        if cos is not None:
            _welford(stats, "cos_n", "cos", cos)
            state["cos_seen"] = int(state["cos_seen"]) + 1
        newest = max(int(v) for v in versions)
        for key in [v for v in versions if int(v) <= newest - self.window]:
            del versions[key]

    def flush(self, model: ModelState, state: PolicyState) -> ModelState | None:
        """The wrapped policy's ``flush`` (the end of the run), or None when it has none."""
        inner = getattr(self.inner, "flush", None)
        if inner is None:
            return None
        out: ModelState | None = inner(model, state["inner"])
        return out


def _build_inner(inner: str, inner_params: dict[str, Any] | None) -> MergePolicy:
    """The wrapped policy; a refusal names the gate's parameter it came from (``inner`` for an
    unknown name, ``inner_params`` for a parameter the wrapped policy refuses)."""
    try:
        return build_policy(inner, inner_params)
    except UnknownPolicyError as exc:
        raise UnknownPolicyError(f"gate: parameter 'inner': {exc}") from exc
    except ConfigError as exc:
        raise ConfigError(f"gate: parameter 'inner_params' (of policy {inner!r}): {exc}") from exc


def _ew_update(state: PolicyState, key: str, value: float, decay: float, *, first: bool) -> None:
    """Exponentially weighted mean and variance, incremental form (Finch 2009, eq. 143)."""
    if first:
        state[f"{key}_mean"], state[f"{key}_var"] = value, 0.0
        return
    mean, var = float(state[f"{key}_mean"]), float(state[f"{key}_var"])
    diff = value - mean
    incr = (1.0 - decay) * diff
    state[f"{key}_mean"] = mean + incr
    state[f"{key}_var"] = decay * (var + diff * incr)


def _welford(stats: dict[str, Any], count: str, key: str, value: float) -> None:
    """Add ``value`` to a running mean and sum of squared deviations (Welford 1962)."""
    n = int(stats[count]) + 1
    mean = float(stats[f"{key}_mean"])
    diff = value - mean
    mean += diff / n
    stats[count], stats[f"{key}_mean"] = n, mean
    stats[f"{key}_m2"] = float(stats[f"{key}_m2"]) + diff * (value - mean)


def _spread(stats: Mapping[str, Any], key: str) -> float:
    """The standard deviation of the values counted under ``key`` (0 for fewer than two)."""
    n = int(stats["n" if key == "norm" else "cos_n"])
    return math.sqrt(max(0.0, float(stats[f"{key}_m2"])) / n) if n > 1 else 0.0


def _pool(versions: Mapping[str, Mapping[str, Any]], version: int, need: int) -> dict[str, Any]:
    """The statistics of the base versions nearest ``version`` (the older first on a tie), pooled
    (Chan, Golub, LeVeque 1979) until they count ``need`` results."""
    pooled: dict[str, Any] = {"n": 0, "norm_mean": 0.0, "norm_m2": 0.0,
                              "cos_n": 0, "cos_mean": 0.0, "cos_m2": 0.0}
    for key in sorted(versions, key=lambda v: (abs(int(v) - version), int(v))):
        stats = versions[key]
        _combine(pooled, stats, "n", "norm")
        _combine(pooled, stats, "cos_n", "cos")
        if int(pooled["n"]) >= need:
            break
    return pooled


def _combine(into: dict[str, Any], other: Mapping[str, Any], count: str, key: str) -> None:
    na, nb = int(into[count]), int(other[count])
    if nb == 0:
        return
    ma, mb = float(into[f"{key}_mean"]), float(other[f"{key}_mean"])
    n = na + nb
    diff = mb - ma
    into[count], into[f"{key}_mean"] = n, ma + diff * nb / n
    into[f"{key}_m2"] = (float(into[f"{key}_m2"]) + float(other[f"{key}_m2"])
                         + diff * diff * na * nb / n)
