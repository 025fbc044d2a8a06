"""The objective protocol: :func:`as_objective` checks an instance and wraps one that does not subclass
:class:`Objective`, so the runners see an :class:`Objective` either way."""

import pytest
import torch

from fbo_torch.objectives.base import Objective, WrappedObjective, as_objective, check_objective_class
from fbo_torch.objectives.synthetic import GPSampleGridFederation


class Duck:
    """Two agents on [0, 2]: f_n(x) = x + n (to maximize)."""

    def __init__(self, noise_variance=0.0, optimum=None):
        self.bounds = torch.tensor([[0.0], [2.0]], dtype=torch.float64)
        self.num_agents = 2
        self.noise_variance = noise_variance
        self.optimum = optimum
        self.groups = torch.tensor([0, 0])

    def __call__(self, X, agents):
        return X[..., 0] + agents.to(X).view(-1, 1)


class DuckWithEvaluate(Duck):
    def _evaluate(self, X, agents, noise):
        return torch.full(X.shape[:2], 7.0 if noise else 5.0, dtype=X.dtype)


class DuckWithObserve(Duck):
    def observe(self, X, keys, agents):
        values = self(X, agents)
        return values + 1.0, values


X = torch.tensor([[[0.5], [1.0]], [[1.5], [2.0]]], dtype=torch.float64)  # 2 agents x 2 points x 1


def test_an_objective_is_returned_as_it_is():
    obj = GPSampleGridFederation(num_groups=1, agents_per_group=2, grid_size=20)
    assert as_objective(obj) is obj


def test_a_duck_is_wrapped_and_validated_like_an_objective():
    duck = Duck()
    obj = as_objective(duck)
    assert isinstance(obj, WrappedObjective) and isinstance(obj, Objective)
    assert obj.dim == 1 and obj.num_agents == 2 and obj.candidates is None
    torch.testing.assert_close(obj(X), X[..., 0] + torch.tensor([[0.0], [1.0]], dtype=torch.float64))
    Y, F = obj.observe(X, torch.tensor([1, 2]))
    torch.testing.assert_close(Y, F)  # no noise_variance: observations are the values
    assert obj.groups is duck.groups  # anything else is read from the wrapped instance
    with pytest.raises(ValueError, match="outside the bounds"):
        obj(X + 5)
    with pytest.raises(ValueError, match="must have shape k x q x d = 2 x q x 1"):
        obj(X[0])
    # the default loss: -best without an optimum, simple regret with one
    best = torch.tensor([[1.0, 2.0]], dtype=torch.float64)
    torch.testing.assert_close(obj.loss(best), -best)
    assert obj.loss_name == "-f"
    opt = as_objective(Duck(optimum=torch.tensor([2.0, 3.0], dtype=torch.float64)))
    torch.testing.assert_close(opt.loss(best), torch.tensor([[1.0, 1.0]], dtype=torch.float64))
    assert opt.loss_name == "simple regret" and opt.rng_state() is None


def test_keyed_noise_of_a_wrapped_duck_has_its_noise_variance():
    obj = as_objective(Duck(noise_variance=0.04))
    Xq = torch.rand(2, 4000, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * 2
    Y, F = obj.observe(Xq, torch.tensor([11, 12]))
    torch.testing.assert_close(F, Xq[..., 0] + torch.tensor([[0.0], [1.0]], dtype=torch.float64))
    noise = (Y - F).flatten()
    # 8000 N(0, 0.2^2) draws: mean within 5 s.e. (0.2 / sqrt(8000)), std within 5 % of 0.2
    assert abs(float(noise.mean())) < 5 * 0.2 / 8000**0.5
    assert abs(float(noise.std()) - 0.2) < 0.01


def test_the_ducks_own_evaluate_and_observe_win():
    obj = as_objective(DuckWithEvaluate())
    assert obj(X).eq(7.0).all() and obj.evaluate_true(X).eq(5.0).all()
    Y, F = as_objective(DuckWithObserve()).observe(X, torch.tensor([0, 1]))
    torch.testing.assert_close(Y, F + 1.0)


@pytest.mark.parametrize(
    "change, says",
    [
        (lambda d: delattr(d, "num_agents"), "has no `num_agents`"),
        (lambda d: setattr(d, "bounds", [[0.0], [1.0]]), "bounds` must be a torch.Tensor"),
        (lambda d: setattr(d, "bounds", torch.tensor([[0], [1]])), "must be a floating-point tensor"),
        (lambda d: setattr(d, "bounds", torch.tensor([[0.0, 1.0]])), "must have shape 2 x d"),
        (lambda d: setattr(d, "num_agents", 0), "num_agents` must be >= 1"),
        (lambda d: setattr(d, "optimum", torch.zeros(3)), r"optimum` must be None or a tensor of shape \(2,\)"),
        (lambda d: setattr(d, "candidates", torch.zeros(5, 2)), r"candidates` must be None or a C x 1 tensor"),
    ],
)
def test_missing_or_malformed_members_are_named(change, says):
    duck = Duck()
    change(duck)
    with pytest.raises((TypeError, ValueError), match=says):
        as_objective(duck, "my duck")


def test_only_objective_classes_pass_the_class_check():
    assert check_objective_class(Duck) is Duck
    with pytest.raises(TypeError, match="not an objective"):
        check_objective_class(dict)
    with pytest.raises(TypeError, match="is a function, not a class"):
        check_objective_class(lambda: None)
    with pytest.raises(TypeError, match="does not implement _evaluate"):
        check_objective_class(type("Half", (Objective,), {}))
