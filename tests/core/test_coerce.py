"""The one annotation coercer behind policy parameters, run-config tables and storage URL options."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pytest
from vcasync.backends.local import LocalStorage

from vcasync.coerce import coerce, describe_type, from_table, is_finite_number, supported
from vcasync.errors import ConfigError
from vcasync.policy import build_policy
from vcasync.runconfig import dataclass_from_table


@dataclass(frozen=True)
class Inner:
    rate: float = 0.1
    mode: Literal["a", "b"] = "a"


@dataclass(frozen=True)
class Outer:
    name: str = "x"
    inner: Inner = field(default_factory=Inner)
    sizes: tuple[int, ...] = ()
    extra: Mapping[str, Any] = field(default_factory=dict)


GOOD: list[tuple[Any, Any, Any]] = [
    (3, float, 3.0),
    (1, int | float, 1),                      # exact type first: stays an int
    (True, bool, True),
    (None, int | None, None),
    ("p/q", Path, Path("p/q")),
    ("p", Path | None, Path("p")),
    ("b", Literal["a", "b"], "b"),
    ([1, 2], list[float], [1.0, 2.0]),
    ([1, 2], tuple[int, ...], (1, 2)),
    ([1, 2], Sequence[int], (1, 2)),
    (["a"], frozenset[str], frozenset({"a"})),
    ({"k": 1}, dict[str, float], {"k": 1.0}),
    ({"k": [1]}, Mapping[str, Any], {"k": [1]}),
    ({"rate": 1, "mode": "b"}, Inner, Inner(1.0, "b")),
]


@pytest.mark.parametrize(("value", "hint", "expected"), GOOD)
def test_values_become_their_annotated_type(value: Any, hint: Any, expected: Any) -> None:
    got = coerce(value, hint, "p")
    assert got == expected
    assert type(got) is type(expected)


BAD: list[tuple[Any, Any, str]] = [
    (True, int, "int"),                       # a bool is not a number
    (True, float, "float"),
    ("1", int, "int"),                        # TOML values are typed: no parsing unless text=True
    (2.5, int, "int"),
    (1, bool, "bool"),
    (1, str, "str"),
    ("c", Literal["a", "b"], "'a' | 'b'"),
    (1, Literal[True], "True"),               # same type and value, so 1 is not True
    ("xy", list[str], r"list\[str\]"),        # a string is not a sequence of strings
    ({1: 2}, dict[str, int], r"dict\[str, int\]"),
    (3, Inner, "a Inner table"),
    (3, Path, "Path"),
]


@pytest.mark.parametrize(("value", "hint", "type_name"), BAD)
def test_a_wrong_value_names_the_parameter_and_the_type(value: Any, hint: Any, type_name: str) -> None:
    with pytest.raises(ConfigError, match=rf"^units\.shards must be {type_name}, got "):
        coerce(value, hint, "units.shards")


TEXT: list[tuple[str, Any, Any]] = [
    ("yes", bool, True),
    ("OFF", bool, False),
    ("0", bool, False),
    ("12", int, 12),
    ("1.5", float, 1.5),
    ("", str | None, None),
    ("", int | None, None),
    ("7", int | None, 7),
    ("eu", str | None, "eu"),
    ("2", Literal[1, 2], 2),
]


@pytest.mark.parametrize(("raw", "hint", "expected"), TEXT)
def test_url_query_text(raw: str, hint: Any, expected: Any) -> None:
    assert coerce(raw, hint, "option 'x'", text=True) == expected


@pytest.mark.parametrize(("raw", "hint", "match"), [
    ("maybe", bool, "option 'x' must be bool, got 'maybe'"),
    ("1.5", int, "option 'x' must be int, got '1.5'"),
    ("a,b", list[str], "option 'x' cannot be given as text"),
    ("{}", Inner, "option 'x' cannot be given as text"),
])
def test_url_query_text_refused(raw: str, hint: Any, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        coerce(raw, hint, "option 'x'", text=True)


def test_nested_tables_name_the_field_and_refuse_unknown_keys() -> None:
    assert from_table(Outer, {"inner": {"rate": 2}, "sizes": [1]}, "t") == Outer(inner=Inner(2.0), sizes=(1,))
    with pytest.raises(ConfigError, match=r"^t\.inner\.mode must be 'a' \| 'b', got 'c'"):
        from_table(Outer, {"inner": {"mode": "c"}}, "t")
    with pytest.raises(ConfigError, match=r"unknown key\(s\) in \[t\.inner\]: rat "):
        from_table(Outer, {"inner": {"rat": 1}}, "t")
    assert dataclass_from_table is from_table


def test_unsupported_annotations_are_said_so() -> None:
    assert not supported(set[int])
    assert not supported(dict[int, str])
    assert supported(Outer)
    assert describe_type(int | None) == "int | None"
    with pytest.raises(ConfigError, match="cannot express"):
        coerce({1}, set[int], "p")


def test_the_three_readers_share_it() -> None:
    """A policy parameter, a URL option and a run-config table read 1 for a float the same way, and
    refuse a bool for a number with the same sentence."""
    alpha = build_policy("vcasgd", {"alpha": 0}).alpha
    assert (alpha, type(alpha)) == (0.0, float)
    with pytest.raises(ConfigError, match=r"^parameter 'alpha' of policy 'vcasgd' must be float, got True$"):
        build_policy("vcasgd", {"alpha": True})
    with pytest.raises(ConfigError, match=r"^option 'durable' must be bool, got 'maybe'$"):
        LocalStorage.from_url("file:///tmp/x?durable=maybe")
    with pytest.raises(ConfigError, match=r"^inner\.rate must be float, got True$"):
        from_table(Inner, {"rate": True}, "inner")


def test_an_int_too_large_for_a_float_is_a_config_error() -> None:
    # Found by a tester: build_policy("vcasgd", {"alpha": 10**400}) (or --policy-param alpha=1 and
    # 400 zeros) raised a raw OverflowError.
    with pytest.raises(ConfigError, match=r"^parameter 'alpha' of policy 'vcasgd' must be float, got an "
                                          r"int of 1329 bits, too large for a float"):
        build_policy("vcasgd", {"alpha": 10**400})
    with pytest.raises(ConfigError, match=r"^p must be float, got an int of"):
        coerce([1.0, 10**400], list[float | None], "p")
    # An int too long even to print (Python refuses over 4,300 digits) is named by its size.
    with pytest.raises(ConfigError, match=r"^p must be str, got an int of 16610 bits$"):
        coerce(10**5000, str, "p")


@pytest.mark.parametrize(("value", "bounds", "ok"), [
    (3, {}, True), (2.5, {}, True), (-1e300, {}, True),
    (True, {}, False), ("1", {}, False), (None, {}, False),
    (math.nan, {}, False), (math.inf, {}, False), (-math.inf, {}, False),
    (10 ** 400, {}, False),                                  # too large for a float
    (0, {"low": 0}, True), (0, {"low": 0, "strict": True}, False),
    (1, {"high": 1}, True), (1, {"high": 1, "high_strict": True}, False),
    (0.5, {"low": 0, "strict": True, "high": 1, "high_strict": True}, True),
    (10 ** 400, {"low": 1}, False),
])
def test_is_finite_number_is_the_one_check(value: Any, bounds: dict[str, Any], ok: bool) -> None:
    # the simulator's and the benches' argument types, price rows, spot paths and the demo's config
    # each had their own copy of this check; they all call this one now
    assert is_finite_number(value, **bounds) is ok


def test_the_argument_types_and_price_checks_share_it() -> None:
    import vcasync.costing.market as market
    import vcasync.costing.prices as prices
    import vcasync.demo.run as demo_run
    import vcasync.sim.cli as sim_cli
    import vcasync.sim.config as sim_config
    from bench import _stats

    for module in (market, prices, demo_run, sim_config):
        assert module.is_finite_number is is_finite_number, module.__name__
    # the argparse types go through the one argparse type, which calls it
    from vcasync.coerce import argument_number
    for module in (sim_cli, _stats):
        assert module.argument_number is argument_number, module.__name__
    assert sim_cli.number is argument_number
