"""The laws of merge policies, each checkable on one example.

Every function here takes a *factory* (anything that builds a fresh policy) and one example, and
raises :class:`~vcasync.testing.policy_run.LawViolation` when the policy breaks the law. The
hypothesis-driven :func:`vcasync.testing.check_policy` (in :mod:`vcasync.testing.suite`) draws the
examples; call these directly to pin a case you care about.

Bound by every policy (:data:`vcasync.policy.REQUIRED_LAWS`):

- ``contract``: None keeps the model bit for bit; a refusal changes neither model nor state; the
  spec is preserved; the state serialises (checked on every step of every law). A policy with a
  ``flush`` is flushed at the end of every stream, under the same checks, and a second flush
  must apply nothing.
- ``inputs_unchanged``: ``update.tensors``, ``update.base`` and the update's metadata
  (``staleness``, ``samples``, ``steps``, ``metrics``, ...) are never changed.
- ``deterministic``: two fresh policies fed the same stream produce the same bits.
- ``state_roundtrip``: a state saved mid-stream through ``vcasync.wire`` and restored into a fresh
  policy continues exactly as the original does (value for value: a NaN equals a NaN whatever its
  bits, which torch's kernels choose by memory layout).
- ``finite``: finite results produce finite models.
- ``counters``: integer tensors count, bools take the last value (:mod:`vcasync.policy`): every
  merge leaves each integer tensor at its value after the previous merge plus the increments of
  every result accepted since (refused ones excluded), and each bool tensor at the value of the
  last of them. Averaging, scaling, taking the maximum or the worker's value all break it.

Claimed in ``policy.claims`` (:data:`vcasync.policy.OPTIONAL_LAWS`):

- ``identity``: results equal to the model (zero deltas, the model's own weights) leave it unchanged.
- ``convex``: a merged model lies, element by element, in the hull of the model and the results
  merged into it (``w_base + d`` for a delta when the policy needs the base, else ``w + d``).
  Floating-point tensors only: integers and bools are the ``counters`` law's.
- ``staleness_monotone``: the same result, staler, never moves the model more.
- ``bounded_influence``: with ``max_outliers`` arbitrary results in a buffer, the merged model stays
  within the hull of the model and the honest results (floating-point tensors; counters count
  every result, by the ``counters`` law).

Staleness is drawn up to a window (the coordinator's ``max_staleness``) with a wide tail beyond it
(:func:`vcasync.testing.strategies.staleness_values`), so a policy that misbehaves only when a
result is very stale is caught.

Floating-point hulls and comparisons allow ``ulps`` units in the last place of the tensor's dtype,
scaled by the magnitudes involved: ``w + (w_c - w)`` is not ``w_c`` in floating point.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..tensors import ModelState, is_counter
from .policy_run import LawViolation, PolicyFactory, PolicyRun, compare_runs, policy_label, roundtrip_state
from .strategies import StreamItem, UpdateStream

__all__ = [
    "DEFAULT_ULPS",
    "MAX_FEED",
    "bounded_influence",
    "contract",
    "convex",
    "counters",
    "deterministic",
    "finite",
    "identity",
    "identity_items",
    "inputs_unchanged",
    "outlier_payload",
    "staleness_monotone",
    "state_roundtrip",
]

#: Default slack, in units in the last place, for floating-point hulls and comparisons.
DEFAULT_ULPS = 4
#: Results fed while waiting for a buffering policy to merge before a law gives up.
MAX_FEED = 64


def _run(factory: PolicyFactory, stream: UpdateStream) -> PolicyRun:
    """The stream fed to a fresh policy, then the end of the run: its ``flush``, if it has one."""
    run = PolicyRun(factory(), stream.model.clone())
    run.feed_all(stream.items)
    run.flush()
    return run


def contract(factory: PolicyFactory, stream: UpdateStream) -> None:
    """None keeps the model; a refusal changes nothing; the spec holds; the state serialises."""
    _run(factory, stream)


def inputs_unchanged(factory: PolicyFactory, stream: UpdateStream) -> None:
    """``update.tensors`` and ``update.base`` come out of every merge bit for bit as they went in."""
    _run(factory, stream)


def deterministic(factory: PolicyFactory, stream: UpdateStream) -> None:
    """Two fresh policies, two copies of the model, the same stream: the same bits at every step."""
    compare_runs(_run(factory, stream), _run(factory, stream), "deterministic",
                 "two runs of the same stream")


def state_roundtrip(factory: PolicyFactory, stream: UpdateStream, cut: int) -> None:
    """After ``cut`` results, a fresh policy with the state restored from the wire continues the
    same way as the original does: the same steps, models and final state, value for value.

    Values, not bits: a restored tensor is contiguous where the original may not be, and torch's
    kernels give a NaN another payload (or sign) depending on the memory layout, so a buffer that
    kept an input's strides (``torch.zeros_like``) holds other NaN bits after the same additions.
    NaN results are in the streams because a policy can receive them (a coordinator configured
    with ``require_finite = false``); a NaN equals a NaN here, whatever its bits."""
    cut = max(0, min(cut, len(stream.items)))
    a = PolicyRun(factory(), stream.model.clone())
    a.feed_all(stream.items[:cut])
    b = a.fork(factory(), roundtrip_state(a.state))
    a.feed_all(stream.items[cut:])
    b.feed_all(stream.items[cut:])
    a.flush()
    b.flush()
    compare_runs(a, b, "state_roundtrip", f"restored after {cut} results vs the original",
                 skip_a=cut, exact=False)


def _require_finite(stream: UpdateStream, law: str) -> None:
    tensors = [*stream.model.values(), *(t for i in stream.items for t in i.tensors.values())]
    if not all(bool(torch.isfinite(t).all()) for t in tensors if t.is_floating_point()):
        raise ValueError(f"the {law} law needs a finite stream (update_streams(allow_nan=False))")


def finite(factory: PolicyFactory, stream: UpdateStream) -> None:
    """Finite model and results in, finite model out, at every step."""
    _require_finite(stream, "finite")
    run = _run(factory, stream)
    for i, step in enumerate(run.steps):
        for name, t in step.model.items():
            if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                raise LawViolation("finite", f"{policy_label(run.policy)}: step {i} made tensor {name!r} "
                                             f"non-finite from finite inputs")


def counters(factory: PolicyFactory, stream: UpdateStream) -> None:
    """Integer tensors count and bools take the last value: after every merge, each integer tensor
    is its value after the previous merge plus the increments of every result accepted since
    (the results the policy kept for later included, refused ones not), each bool tensor the value
    of the last of them. Increments are the update's integers as the policy got them (a full-
    weights result's values less its base version's: PolicyRun converts like the coordinator)."""
    run = PolicyRun(factory(), stream.model.clone())
    names = [n for n, t in stream.model.items() if not (t.is_floating_point() or t.is_complex())]
    if not names:
        run.feed_all(stream.items)
        return
    expected = {n: stream.model[n].clone() for n in names}
    for i, item in enumerate(stream.items):
        step = run.feed(item)
        if step.outcome == "rejected":
            continue
        assert step.update is not None
        for n in names:
            x = step.update.tensors[n]
            if is_counter(x):
                expected[n].add_(x)
            else:
                expected[n].copy_(x)
        if step.outcome != "merged":
            continue
        for n in names:
            got = run.model[n]
            if not torch.equal(got, expected[n]):
                rule = ("the last merged result's value" if got.dtype == torch.bool else
                        "the model's value plus every merged increment")
                raise LawViolation("counters", f"{policy_label(run.policy)}: step {i}: {got.dtype} tensor "
                                               f"{n!r} is {got.flatten()[:6].tolist()}, expected "
                                               f"{expected[n].flatten()[:6].tolist()} ({rule})")
        expected = {n: run.model[n].clone() for n in names}
    flushed = run.flush()
    if flushed is not None and flushed.outcome == "flushed":
        for n in names:          # the flush applies every increment held, and the last bool
            if not torch.equal(run.model[n], expected[n]):
                raise LawViolation("counters", f"{policy_label(run.policy)}: the end-of-run flush left "
                                               f"{run.model[n].dtype} tensor {n!r} at "
                                               f"{run.model[n].flatten()[:6].tolist()}, expected "
                                               f"{expected[n].flatten()[:6].tolist()}")


def identity_items(model: ModelState, like: Sequence[StreamItem]) -> list[StreamItem]:
    """Results equal to ``model`` with the metadata of ``like``: zero deltas (zero increments for
    integers, the model's values for bools) or the model's own weights. While the model stays
    unchanged every base version equals it, so the lags (and staleness) of ``like`` are kept."""
    items = []
    for item in like:
        if item.kind == "delta":
            tensors = {n: t.clone() if t.dtype == torch.bool else torch.zeros_like(t)
                       for n, t in model.items()}
        else:
            tensors = {n: t.clone() for n, t in model.items()}
        items.append(StreamItem(tensors, item.kind, item.lag, item.samples, item.steps,
                                item.worker_id, item.unit_id, dict(item.metrics)))
    return items


def identity(factory: PolicyFactory, stream: UpdateStream) -> None:
    """Results equal to the model (``identity_items``) leave it unchanged (value for value)."""
    _require_finite(stream, "identity")
    run = PolicyRun(factory(), stream.model.clone())
    for i, item in enumerate(identity_items(stream.model, stream.items)):
        run.feed(item)
        for name, t in run.model.items():
            if not torch.equal(t, stream.model[name]):
                raise LawViolation("identity", f"{policy_label(run.policy)}: step {i}: a result equal to the "
                                               f"model changed tensor {name!r}: "
                                               f"{stream.model[name].flatten()[:6].tolist()} -> "
                                               f"{t.flatten()[:6].tolist()}")


def _slack(dtype: torch.dtype, scale: torch.Tensor, ulps: int) -> torch.Tensor:
    if not dtype.is_floating_point:
        return torch.zeros_like(scale)
    info = torch.finfo(dtype)
    return scale * (ulps * info.eps) + ulps * info.tiny


def _check_hull(law: str, label: str, name: str, out: torch.Tensor,
                points: Sequence[torch.Tensor], extra_scale: Sequence[torch.Tensor], ulps: int) -> None:
    stack = torch.stack([p.double() for p in points])
    lo, hi = stack.amin(0), stack.amax(0)
    scale = torch.stack([p.double().abs() for p in [*points, *extra_scale]]).amax(0)
    tol = _slack(out.dtype, scale, ulps)
    o = out.double()
    bad = (o < lo - tol) | (o > hi + tol)
    if bool(bad.any()):
        idx = int(bad.flatten().nonzero()[0])
        raise LawViolation(law, f"{label}: tensor {name!r}[{idx}] = {o.flatten()[idx].item()!r} lies "
                                f"outside [{lo.flatten()[idx].item()!r}, {hi.flatten()[idx].item()!r}]"
                                f" (slack {tol.flatten()[idx].item():.3g})")


def convex(factory: PolicyFactory, stream: UpdateStream, *, ulps: int = DEFAULT_ULPS) -> None:
    """Each merged model lies in the hull of the model before and the results merged into it."""
    _require_finite(stream, "convex")
    run = PolicyRun(factory(), stream.model.clone())
    start = run.model.clone()
    window: list[dict[str, torch.Tensor]] = []
    extra: list[dict[str, torch.Tensor]] = []
    for i, item in enumerate(stream.items):
        before = run.model.clone()
        base = run.model_at(run.base_version(item.lag)) if run.policy.needs_base else before
        floats = [n for n, t in base.items() if t.is_floating_point()]
        if item.kind == "weights":
            result = {n: item.tensors[n] for n in floats}
        else:
            result = {n: torch.add(base[n], item.tensors[n]) for n in floats}
        step = run.feed(item)
        if step.outcome == "rejected":
            continue
        window.append(result)
        extra.append({n: base[n].abs() + item.tensors[n].abs() for n in floats})
        if step.outcome == "merged":
            for name, out in run.model.items():
                if not out.is_floating_point():
                    continue   # integers and bools: the counters law
                _check_hull("convex", f"{policy_label(run.policy)}: step {i}", name, out,
                            [start[name], *(r[name] for r in window)], [e[name] for e in extra], ulps)
            start, window, extra = run.model.clone(), [], []


def staleness_monotone(factory: PolicyFactory, stream: UpdateStream, fresh: int, stale: int, *,
                       ulps: int = DEFAULT_ULPS) -> None:
    """The first result of ``stream``, fed until the policy merges, with staleness ``stale >
    fresh``, moves no element of the model more than with staleness ``fresh``."""
    _require_finite(stream, "staleness_monotone")
    if not stale > fresh >= 0 or not stream.items:
        raise ValueError("need a stream with items and 0 <= fresh < stale")
    item = StreamItem(stream.items[0].tensors, stream.items[0].kind, 0, stream.items[0].samples)
    runs = []
    for tau in (fresh, stale):
        run = PolicyRun(factory(), stream.model.clone())
        for _ in range(MAX_FEED):
            if run.feed(item, staleness=tau).outcome != "kept":
                break
        runs.append(run)
    a, b = runs[0].steps[-1], runs[1].steps[-1]
    label = f"{policy_label(runs[0].policy)}: staleness {fresh} vs {stale}"
    if a.outcome == "rejected" and b.outcome == "merged":
        raise LawViolation("staleness_monotone", f"{label}: the fresher result was refused and the "
                                                 f"staler one merged")
    if b.outcome != "merged" or a.outcome != "merged":
        return
    for name, w in stream.model.items():
        if not w.is_floating_point():
            continue
        w64 = w.double()
        move_a = (a.model[name].double() - w64).abs()
        move_b = (b.model[name].double() - w64).abs()
        scale = torch.stack([w64.abs(), a.model[name].double().abs(), b.model[name].double().abs(),
                             item.tensors[name].double().abs()]).amax(0)
        bad = move_b > move_a + _slack(w.dtype, scale, ulps)
        if bool(bad.any()):
            idx = int(bad.flatten().nonzero()[0])
            raise LawViolation("staleness_monotone", f"{label}: tensor {name!r}[{idx}] moved "
                                                     f"{move_b.flatten()[idx].item()!r} when staler vs "
                                                     f"{move_a.flatten()[idx].item()!r}")


def outlier_payload(model: ModelState, sign: int = 1) -> dict[str, torch.Tensor]:
    """A hostile delta: huge values of alternating sign (within each dtype's range), huge counters."""
    out: dict[str, torch.Tensor] = {}
    for name, t in model.items():
        if t.dtype == torch.bool:
            out[name] = torch.ones_like(t)
        elif t.is_floating_point():
            big = min(1e6, torch.finfo(t.dtype).max / 64)
            pattern = torch.arange(t.numel()).remainder(2).mul(2).sub(1).to(torch.float64) * sign
            out[name] = (pattern * big).to(t.dtype).reshape(t.shape)
        else:
            out[name] = torch.full_like(t, min(10**9, torch.iinfo(t.dtype).max))
    return out


def bounded_influence(factory: PolicyFactory, stream: UpdateStream, positions: Sequence[int], *,
                      ulps: int = DEFAULT_ULPS) -> None:
    """Honest deltas (``stream``'s, cycled) with ``max_outliers`` hostile ones at ``positions``
    (taken modulo the buffer): the merged model stays in the hull of the model and the honest
    results ``w + d``."""
    _require_finite(stream, "bounded_influence")
    policy = factory()
    f = int(getattr(policy, "max_outliers"))  # noqa: B009 - validated when the policy was built
    honest = [StreamItem({n: t.clone() for n, t in i.tensors.items()}, "delta", 0, i.samples)
              for i in stream.items] or [identity_items(stream.model, [StreamItem({})])[0]]
    probe = PolicyRun(factory(), stream.model.clone())
    k = next((j + 1 for j in range(MAX_FEED)
              if probe.feed(honest[j % len(honest)]).outcome == "merged"), None)
    if k is None:
        raise LawViolation("bounded_influence",
                           f"{policy_label(policy)} merged nothing after {MAX_FEED} results")
    bad_slots = sorted({p % k for p in positions})[:f]
    items = [honest[j % len(honest)] for j in range(k)]
    for n, j in enumerate(bad_slots):
        items[j] = StreamItem(outlier_payload(stream.model, 1 if n % 2 == 0 else -1), "delta", 0, 1)
    run = PolicyRun(policy, stream.model.clone())
    run.feed_all(items)
    label = f"{policy_label(policy)} with {len(bad_slots)} outlier(s) at {bad_slots} of {k}"
    if run.steps[-1].outcome != "merged":
        raise LawViolation("bounded_influence", f"{label}: did not merge after the same {k} results")
    good = [items[j] for j in range(k) if j not in bad_slots]
    for name, w in stream.model.items():
        if not w.is_floating_point():
            continue   # counters count every result, outliers too (the counters law)
        points = [w] + [torch.add(w, i.tensors[name]) for i in good]
        extra = [w.abs() + i.tensors[name].abs() for i in good]
        _check_hull("bounded_influence", label, name, run.model[name], points, extra, ulps)
