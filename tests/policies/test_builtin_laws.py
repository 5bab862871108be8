"""Every built-in policy, in several configurations, held to the required laws and its claims."""

from __future__ import annotations

import functools
from typing import Any

import pytest

from vcasync.policy import REQUIRED_LAWS, build_policy
from vcasync.testing import check_policy

CONFIGS: list[tuple[str, dict[str, Any]]] = [
    ("vcasgd", {}),
    ("vcasgd", {"alpha": 0.9, "schedule": "cosine", "alpha_end": 0.2, "horizon": 3,
                "staleness": "hinge", "a": 2.0, "b": 1}),
    ("vcasgd", {"alpha": 0.0, "schedule": "linear", "alpha_end": 0.8, "horizon": 2,
                "staleness": "polynomial", "a": 1.0}),
    ("fedasync", {}),
    ("fedasync", {"alpha": 1.0, "staleness": "hinge", "a": 10.0, "b": 1}),
    ("fedbuff", {"buffer_size": 3}),
    ("fedbuff", {"buffer_size": 1, "server_lr": 2.0, "staleness": "constant"}),
    ("diloco", {}),
    ("diloco", {"buffer_size": 3, "nesterov": False, "lr": 1.3}),
    ("median", {"buffer_size": 3}),
    ("median", {"buffer_size": 4, "lr": 0.5}),
    ("trimmed_mean", {"buffer_size": 5}),
    ("trimmed_mean", {"buffer_size": 7, "beta": 0.3}),
    ("sync", {"buffer_size": 3}),
    ("sync", {"buffer_size": 1}),
    ("gate", {"warmup": 1, "z": 1.0}),
    ("gate", {"inner": "median", "inner_params": {"buffer_size": 3}, "warmup": 2}),
    ("gate", {"inner": "fedbuff", "inner_params": {"buffer_size": 2}, "min_cosine": 0.0,
              "warmup": 0}),
]


def _id(case: tuple[str, dict[str, Any]]) -> str:
    name, params = case
    return name + ("(" + ",".join(f"{k}={v}" for k, v in params.items()) + ")" if params else "")


@pytest.mark.parametrize("case", CONFIGS, ids=[_id(c) for c in CONFIGS])
def test_builtin_obeys_its_laws(case: tuple[str, dict[str, Any]]) -> None:
    name, params = case
    factory = functools.partial(build_policy, name, params)
    ran = check_policy(factory, max_examples=20)
    assert set(ran) == REQUIRED_LAWS | factory().claims


def test_claims_are_what_the_docs_say() -> None:
    claims = {name: build_policy(name).claims for name, _ in CONFIGS}
    assert claims["vcasgd"] == claims["fedasync"] == {"identity", "convex", "staleness_monotone"}
    assert claims["fedbuff"] == {"identity", "staleness_monotone"}
    assert claims["diloco"] == {"identity"}
    assert claims["median"] == claims["trimmed_mean"] == {"identity", "bounded_influence"}
    assert claims["sync"] == {"identity", "convex"}
    assert claims["gate"] == claims["vcasgd"]  # the wrapped policy's (vcasgd by default)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["vcasgd", "fedasync", "fedbuff", "diloco", "median",
                                  "trimmed_mean", "gate", "sync"])
def test_builtin_defaults_hold_for_many_examples(name: str) -> None:
    small = {"buffer_size": 3} if name in ("fedbuff", "sync", "median", "trimmed_mean") else {}
    check_policy(functools.partial(build_policy, name, small), max_examples=75)
