from __future__ import annotations

import pytest
import torch
from torch import nn

from vcasync import ModelSpec, ModelState
from vcasync.errors import SpecMismatchError, ValidationError


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(4 * 6 * 6, 10))


def test_from_module_keeps_parameters_and_buffers() -> None:
    net = _net()
    state = ModelState.from_module(net, version=3)
    assert state.version == 3
    assert list(state) == list(net.state_dict())
    assert state["1.num_batches_tracked"].dtype == torch.int64
    assert "1.running_mean" in state
    # a copy: changing the module does not change the state
    with torch.no_grad():
        net[0].weight.add_(1.0)
    assert not torch.equal(state["0.weight"], net[0].weight)


def test_load_into_round_trip_and_digest() -> None:
    a, b = _net(), _net()
    with torch.no_grad():
        b[0].weight.zero_()
    state = ModelState.from_module(a)
    state.load_into(b)
    assert ModelState.from_module(b).digest() == state.digest()
    assert ModelState.from_module(b).equal(state)
    c = state.clone()
    c["0.weight"].add_(1e-3)
    assert c.digest() != state.digest()


def test_spec_check_names_the_problem() -> None:
    state = ModelState.from_module(_net())
    spec = state.spec
    assert isinstance(spec, ModelSpec)
    assert spec == ModelSpec.of(state)
    good = {k: v.clone() for k, v in state.items()}
    spec.check(good, require_finite=True)

    missing = dict(good)
    missing.pop("0.bias")
    with pytest.raises(SpecMismatchError, match=r"0\.bias"):
        spec.check(missing)
    with pytest.raises(SpecMismatchError, match="unknown tensor 'x'"):
        spec.check({**good, "x": torch.zeros(1)})
    with pytest.raises(SpecMismatchError, match="dtype"):
        spec.check({**good, "0.bias": good["0.bias"].double()})
    with pytest.raises(SpecMismatchError, match="shape"):
        spec.check({**good, "0.bias": torch.zeros(5)})
    bad = {**good, "0.bias": torch.tensor([0.0, float("nan"), 0.0, 0.0])}
    with pytest.raises(ValidationError, match="NaN") as exc:
        spec.check(bad, require_finite=True)
    assert exc.value.reason == "non_finite"


def test_tensor_bytes_of_strided_single_element() -> None:
    from vcasync.tensors import tensor_bytes

    t = torch.tensor([1.5, 2.5], dtype=torch.bfloat16)[::2]
    assert bytes(tensor_bytes(t)) == bytes(tensor_bytes(torch.tensor([1.5], dtype=torch.bfloat16)))


FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64,
          torch.complex128, torch.float8_e5m2, torch.float8_e4m3fn]


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("bad", ["nan", "inf", "-inf"])
def test_all_finite_finds_one_bad_element_anywhere(dtype: torch.dtype, bad: str) -> None:
    from vcasync.tensors import all_finite

    n = 3 * (1 << 20) + 7            # past one upcast slice for the float8 types
    for where in (0, n // 2, n - 1):
        t = torch.zeros(n, dtype=torch.float32).to(dtype)
        assert all_finite(t)
        value = torch.tensor([float(bad)], dtype=torch.float32).to(dtype)
        if all_finite(value):        # float8_e4m3fn has no infinity: the cast saturates
            continue
        t[where] = value[0]
        assert not all_finite(t)
        assert not all_finite(t.reshape(-1, 1).expand(-1, 2).t())     # non-contiguous


def test_all_finite_of_other_shapes_and_dtypes() -> None:
    from vcasync.tensors import all_finite

    assert all_finite(torch.empty(0))
    assert all_finite(torch.tensor(1.0))
    assert not all_finite(torch.tensor(float("nan")))
    assert all_finite(torch.tensor([1, 2], dtype=torch.int64))
    assert all_finite(torch.tensor([True]))
    assert not all_finite(torch.tensor([complex(0.0, float("inf"))]))


class _Tied(nn.Module):
    """A language model's shape: the head's weight IS the embedding's (two state-dict names)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(5, 3)
        self.mid = nn.Linear(3, 3)
        self.head = nn.Linear(3, 5, bias=False)
        self.head.weight = self.emb.weight


def test_from_module_records_tied_names_and_keeps_them_through_clone() -> None:
    state = ModelState.from_module(_Tied())
    assert state.ties == (("emb.weight", "head.weight"),)
    assert state.clone().ties == state.ties
    # each name holds its own copy: a merge that updates names one by one updates each once
    assert state["emb.weight"].data_ptr() != state["head.weight"].data_ptr()
    assert ModelState.from_module(_net()).ties == ()


def test_views_of_one_storage_at_other_offsets_are_not_ties() -> None:
    net = nn.Module()
    base = torch.zeros(2, 3)
    net.register_buffer("a", base[0])
    net.register_buffer("b", base[1])
    net.register_buffer("e1", torch.zeros(0))
    net.register_buffer("e2", torch.zeros(0))
    assert ModelState.from_module(net).ties == ()


@pytest.mark.parametrize(("ties", "words"), [
    ("ab", "collection of groups"),
    ([["a"]], "two or more distinct names"),
    ([["a", "a"]], "two or more distinct names"),
    ([["a", "zz"]], "not one of its tensors"),
    ([["a", "c"]], "one dtype and shape"),
    ([["a", "b"], ["b", "d"]], "in two ties"),
])
def test_bad_ties_are_a_config_error(ties: object, words: str) -> None:
    from vcasync.errors import ConfigError
    tensors = {"a": torch.zeros(2), "b": torch.zeros(2), "c": torch.zeros(3), "d": torch.zeros(2)}
    with pytest.raises(ConfigError, match=words):
        ModelState(tensors, ties=ties)  # type: ignore[arg-type]


def test_check_tensors_refuses_split_ties_bit_for_bit() -> None:
    from vcasync.coordinator._result_checks import check_tensors
    state = ModelState.from_module(_Tied())
    good = {k: v.clone() for k, v in state.items()}
    check_tensors(good, state.spec, require_finite=False, max_norm=None, ties=state.ties)
    nan = {k: v.clone() for k, v in state.items()}
    nan["emb.weight"][0, 0] = nan["head.weight"][0, 0] = float("nan")   # same bits: one value
    check_tensors(nan, state.spec, require_finite=False, max_norm=None, ties=state.ties)
    signed = {k: v.clone() for k, v in state.items()}
    signed["emb.weight"][4, 2], signed["head.weight"][4, 2] = 0.0, -0.0   # equal, not one value
    bad = {k: v.clone() for k, v in state.items()}
    bad["head.weight"][1, 1] += 1e-3
    for split in (signed, bad):
        with pytest.raises(ValidationError, match=r"'emb\.weight' and 'head\.weight' are one tens") as e:
            check_tensors(split, state.spec, require_finite=False, max_norm=None, ties=state.ties)
        assert e.value.reason == "tie_mismatch"
