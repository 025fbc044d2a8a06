import math

import pytest
import torch
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from fbo_torch.objectives.search_space import Integer, Real, SearchSpace, as_search_space

f64 = torch.float64


@pytest.fixture
def space():
    return SearchSpace(
        [
            Real("C", 1e-4, 10, log=True),
            Real("gamma", 1e-2, 10, log=True),
            Real("momentum", 0.1, 0.9),
            Integer("batch_size", 20, 60),
        ]
    )


def test_structure(space):
    assert space.names == ["C", "gamma", "momentum", "batch_size"]
    assert space.dim == len(space) == 4
    torch.testing.assert_close(space.bounds, torch.stack([torch.zeros(4, dtype=f64), torch.ones(4, dtype=f64)]))
    torch.testing.assert_close(
        space.native_bounds, torch.tensor([[1e-4, 1e-2, 0.1, 20.0], [10.0, 10.0, 0.9, 60.0]], dtype=f64)
    )
    assert space["gamma"].log and space.index("batch_size") == 3 and "C" in space and "x" not in space
    with pytest.raises(KeyError, match="No parameter named 'x'"):
        space["x"]
    assert space == SearchSpace(list(space.parameters)) and hash(space) == hash(SearchSpace(list(space)))


def test_real_round_trips_and_endpoints(space):
    U = torch.rand(7, 5, 4, dtype=f64)
    U[..., 3] = 0.5  # integer column checked separately
    V = space.to_native(U)
    assert V.shape == U.shape and V.dtype == f64
    torch.testing.assert_close(space.from_native(V)[..., :3], U[..., :3], rtol=0, atol=1e-12)
    torch.testing.assert_close(space.to_native(space.from_native(V)), V, rtol=1e-12, atol=0)
    lo = space.to_native(torch.zeros(4, dtype=f64))
    hi = space.to_native(torch.ones(4, dtype=f64))
    assert lo.tolist() == [1e-4, 1e-2, 0.1, 20.0]  # exact at the ends
    assert hi.tolist() == [10.0, 10.0, 0.9, 60.0]
    assert (V >= space.native_bounds[0]).all() and (V <= space.native_bounds[1]).all()


def test_log_and_linear_midpoints(space):
    v = space.to_native(torch.full((4,), 0.5, dtype=f64))
    assert v[0].item() == pytest.approx(math.sqrt(1e-4 * 10), rel=1e-12)  # geometric mean
    assert v[1].item() == pytest.approx(math.sqrt(1e-2 * 10), rel=1e-12)
    assert v[2].item() == pytest.approx(0.5, rel=1e-12)  # arithmetic mean
    # log-uniform: equal steps in u are equal ratios
    u = torch.tensor([[0.2, 0, 0, 0], [0.4, 0, 0, 0], [0.6, 0, 0, 0]], dtype=f64)
    c = space.to_native(u)[:, 0]
    assert (c[1] / c[0]).item() == pytest.approx((c[2] / c[1]).item(), rel=1e-10)


def test_integers_in_range_equal_cells_and_round_trip():
    space = SearchSpace([Integer("batch_size", 20, 60)])
    U = torch.linspace(0, 1, 41 * 1000 + 1, dtype=f64).unsqueeze(-1)
    V = space.to_native(U).squeeze(-1)
    assert (V == V.round()).all() and V.min() == 20 and V.max() == 60
    counts = torch.bincount(V.long() - 20, minlength=41)
    assert (counts > 0).all()
    assert counts.max() - counts.min() <= 2  # every integer owns 1/41 of [0, 1], ends included
    ints = torch.arange(20, 61, dtype=f64).unsqueeze(-1)
    assert torch.equal(space.to_native(space.from_native(ints)), ints)
    # non-integral native values are rounded half up first
    assert space.to_native(space.from_native(torch.tensor([[31.5]], dtype=f64))).item() == 32
    # monotone in u
    assert (V[1:] >= V[:-1]).all()


def test_log_integer():
    space = SearchSpace([Integer("width", 1, 1024, log=True)])
    ints = torch.tensor([[1.0], [2.0], [3.0], [100.0], [1023.0], [1024.0]], dtype=f64)
    assert torch.equal(space.to_native(space.from_native(ints)), ints)
    V = space.to_native(torch.rand(500, 1, dtype=f64))
    assert (V == V.round()).all() and V.min() >= 1 and V.max() <= 1024
    assert space.to_native(torch.tensor([0.5], dtype=f64)).item() == pytest.approx(math.sqrt(0.5 * 1024.5), abs=0.5)


def test_dtype_device_and_batch_shapes(space):
    U = torch.rand(2, 3, 5, 4, dtype=torch.float32)
    V = space.to_native(U)
    assert V.dtype == torch.float32 and V.shape == (2, 3, 5, 4)
    back = space.from_native(V)
    assert back.dtype == torch.float32
    torch.testing.assert_close(back[..., :3], U[..., :3], rtol=0, atol=1e-5)


def test_named_values(space):
    u = torch.tensor([0.5, 0.0, 1.0, 1.0], dtype=f64)
    d = space.to_dict(u)
    assert list(d) == space.names
    assert isinstance(d["batch_size"], int) and d["batch_size"] == 60
    assert isinstance(d["C"], float) and d["gamma"] == pytest.approx(1e-2)
    assert space.to_dict([0.5, 0.0, 1.0, 1.0]) == d
    torch.testing.assert_close(space.from_values(d), space.from_native(space.to_native(u)))
    U = torch.rand(3, 2, 4, dtype=f64)
    ds = space.to_dicts(U)
    assert len(ds) == 3 and all(len(r) == 2 for r in ds)
    assert ds[2][1] == space.to_dict(U[2, 1])
    U2 = torch.rand(5, 4, dtype=f64)
    assert space.to_dicts(U2) == [space.to_dict(r) for r in U2]
    with pytest.raises(ValueError, match="missing: \\['batch_size'\\]"):
        space.from_values({"C": 1.0, "gamma": 1.0, "momentum": 0.5})
    with pytest.raises(ValueError, match="unknown: \\['lr'\\]"):
        space.from_values({"C": 1.0, "gamma": 1.0, "momentum": 0.5, "batch_size": 30, "lr": 1})
    with pytest.raises(ValueError, match="single point"):
        space.to_dict(torch.rand(2, 4))


def test_out_of_cube_and_out_of_range(space):
    with pytest.raises(ValueError, match="unit cube"):
        space.to_native(torch.tensor([0.5, 0.5, 1.1, 0.5], dtype=f64))
    with pytest.raises(ValueError, match="unit cube"):
        space.to_native(torch.tensor([-0.01, 0.5, 0.5, 0.5], dtype=f64))
    v = space.to_native(torch.tensor([1 + 1e-9, -1e-9, 0.5, 0.5], dtype=f64))  # round-off is clipped
    assert v[0].item() == 10.0 and v[1].item() == 1e-2
    with pytest.raises(ValueError, match="last dimension"):
        space.to_native(torch.rand(3, 2, dtype=f64))
    with pytest.raises(TypeError, match="floating"):
        space.to_native(torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="finite"):
        space.to_native(torch.tensor([float("nan"), 0.5, 0.5, 0.5], dtype=f64))
    with pytest.raises(ValueError, match="`gamma` must lie in \\[0.01, 10.0\\]"):
        space.from_native(torch.tensor([1.0, 20.0, 0.5, 30.0], dtype=f64))


def test_parameter_errors():
    with pytest.raises(ValueError, match="`C`: `low` must be < `high`"):
        Real("C", 10, 1)
    with pytest.raises(ValueError, match="`C`: `low` must be < `high`"):
        Real("C", 1, 1)
    with pytest.raises(ValueError, match="log-scale parameter needs low > 0"):
        Real("lr", 0.0, 1.0, log=True)
    with pytest.raises(ValueError, match="must be an integer"):
        Integer("bs", 20.5, 60)
    with pytest.raises(ValueError, match="needs low >= 1"):
        Integer("bs", 0, 60, log=True)
    with pytest.raises(TypeError, match="non-empty string"):
        Real("", 0, 1)
    with pytest.raises(TypeError, match="must be a number"):
        Real("x", "abc", 1)
    with pytest.raises(ValueError, match="finite"):
        Real("x", 0, float("inf"))
    with pytest.raises(ValueError, match="unique"):
        SearchSpace([Real("x", 0, 1), Real("x", 0, 2)])
    with pytest.raises(ValueError, match="at least one"):
        SearchSpace([])
    with pytest.raises(TypeError, match="parameters\\[1\\]"):
        SearchSpace([Real("x", 0, 1), ("y", 0, 1)])
    with pytest.raises(TypeError, match="sequence"):
        SearchSpace(Real("x", 0, 1))


def test_from_dict_and_yaml():
    text = """
    C: {low: 1e-4, high: 10, log: true}
    gamma: {low: 1.0e-2, high: 10, log: true}
    batch_size: {low: 20, high: 60, type: int}
    momentum: {low: 0, high: 0.9}
    """
    space = SearchSpace.from_dict(yaml.safe_load(text))  # PyYAML reads "1e-4" as a string
    assert space.names == ["C", "gamma", "batch_size", "momentum"]
    assert space["C"] == Real("C", 1e-4, 10.0, log=True)
    assert space["batch_size"] == Integer("batch_size", 20, 60)
    assert space["momentum"] == Real("momentum", 0.0, 0.9)
    assert SearchSpace.from_dict(space.to_config()) == space
    assert SearchSpace.from_dict(yaml.safe_load(yaml.safe_dump(space.to_config(), sort_keys=False))) == space


@pytest.mark.parametrize(
    "config, err, match",
    [
        ({"C": {"low": 1e-4, "high": 10, "scale": "log"}}, ValueError, "unknown key\\(s\\) \\['scale'\\]"),
        ({"C": {"low": 10, "high": 1e-4}}, ValueError, "`low` must be < `high`"),
        ({"C": {"low": 1, "high": 1}}, ValueError, "`low` must be < `high`"),
        ({"C": {"low": 0, "high": 10, "log": True}}, ValueError, "needs low > 0"),
        ({"C": {"low": -1, "high": 10, "log": True}}, ValueError, "needs low > 0"),
        ({"bs": {"low": 0, "high": 10, "log": True, "type": "int"}}, ValueError, "needs low >= 1"),
        ({"C": {"low": 1e-4}}, ValueError, "missing \\['high'\\]"),
        ({"C": {"low": 0, "high": 1, "type": "categorical"}}, ValueError, "unknown type 'categorical'"),
        ({"C": {"low": 0, "high": 1, "log": "yes"}}, TypeError, "`log` must be true/false"),
        ({"C": [0, 1]}, TypeError, "must be a mapping"),
        ({}, ValueError, "at least one parameter"),
        ([("C", 0, 1)], TypeError, "must be a mapping"),
    ],
)
def test_from_dict_errors(config, err, match):
    with pytest.raises(err, match=match):
        SearchSpace.from_dict(config)


def test_as_search_space():
    default = SearchSpace([Real("a", 0, 1), Real("b", 0, 1)])
    assert as_search_space(None, default, ["a", "b"]) is default
    s = as_search_space({"b": {"low": 1, "high": 2}, "a": {"low": 0, "high": 3}}, default, ["a", "b"])
    assert s.names == ["b", "a"]
    with pytest.raises(ValueError, match="exactly the parameters \\['a', 'b'\\]"):
        as_search_space({"a": {"low": 0, "high": 1}}, default, ["a", "b"])
    with pytest.raises(TypeError, match="SearchSpace"):
        as_search_space(3, default, ["a", "b"])


@settings(max_examples=60, deadline=None)
@given(
    low=st.floats(1e-6, 1e3),
    ratio=st.floats(1.001, 1e6),
    log=st.booleans(),
    u=st.lists(st.floats(0, 1), min_size=1, max_size=8),
)
def test_round_trip_property(low, ratio, log, u):
    space = SearchSpace([Real("x", low, low * ratio, log=log)])
    U = torch.tensor(u, dtype=f64).unsqueeze(-1)
    V = space.to_native(U)
    assert (V >= low).all() and (V <= low * ratio).all()
    torch.testing.assert_close(space.from_native(V), U, rtol=0, atol=1e-9)


@settings(max_examples=40, deadline=None)
@given(low=st.integers(-50, 50), width=st.integers(1, 200), u=st.lists(st.floats(0, 1), min_size=1, max_size=8))
def test_integer_property(low, width, u):
    space = SearchSpace([Integer("n", low, low + width)])
    V = space.to_native(torch.tensor(u, dtype=f64).unsqueeze(-1))
    assert (V == V.round()).all() and (V >= low).all() and (V <= low + width).all()
    assert torch.equal(space.to_native(space.from_native(V)), V)
