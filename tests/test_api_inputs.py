"""Bad API inputs get one line naming the argument (before: tracebacks from deep inside, or silence)."""

import pytest
import torch
from botorch.models import SingleTaskGP

from fbo_torch.acquisition.fts import FederatedThompsonSampling
from fbo_torch.features import RandomFourierFeatures
from fbo_torch.federation.aggregator import DPAggregator
from fbo_torch.models.rff_blr import RFFBayesianLinear
from fbo_torch.protocol.weights import ExplorationWeights
from fbo_torch.utils.secure_random import secret_normal, secret_uniform

RFF = RandomFourierFeatures(2, 8, 0.3)
X = torch.rand(5, 2, dtype=torch.float64)
Y = torch.rand(5, 1, dtype=torch.float64)


def _one_line(err):
    text = str(err.value)
    assert "\n" not in text
    return text


@pytest.mark.parametrize(
    ("call", "kind", "says"),
    [
        (lambda: RFF(torch.tensor(0.5, dtype=torch.float64)), ValueError, "`X` must be ... x d with d = 2"),
        (lambda: RFF([[0.1, 0.2]]), TypeError, "`X` must be a torch.Tensor"),
        (
            lambda: RFFBayesianLinear(RFF, X.to("meta"), Y.to("meta"), 0.1),
            ValueError,
            "`train_X` is on the meta device",
        ),
        (lambda: RFFBayesianLinear(RFF, X.float(), Y, 0.1), ValueError, "`train_X` (torch.float32, cpu) and `train_Y`"),
        (lambda: RFFBayesianLinear(RFF, X, Y, 0.1).sample_weights(-1), TypeError, "`sample_shape` must be a shape"),
        (lambda: RFFBayesianLinear(RFF, X, Y, 0.1).sample_weights((-1,)), ValueError, "`sample_shape` must have sizes"),
        (lambda: secret_normal(bytes(32), ("x",), (-1,)), ValueError, "`shape` must have sizes >= 0, got (-1,)"),
        (lambda: secret_uniform(bytes(32), ("x",), (2.5,)), TypeError, "`shape` must be a shape of integers"),
        (lambda: RandomFourierFeatures(2, 8, device="gpu"), ValueError, "`device` must name a torch device"),
        (lambda: RandomFourierFeatures(2, 8, device="meta"), ValueError, "`device` is the meta device"),
    ],
)
def test_bad_inputs_get_one_line_naming_the_argument(call, kind, says):
    with pytest.raises(kind) as err:
        call()
    assert says in _one_line(err)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without CUDA")
def test_a_cuda_device_without_cuda_is_named():
    with pytest.raises(ValueError) as err:
        RandomFourierFeatures(2, 8, device="cuda")
    assert "`device` is 'cuda', but CUDA is not available here" in _one_line(err)


def test_a_float_reported_mask_is_refused():
    weights = ExplorationWeights(torch.ones(1, 3, dtype=torch.bool), mode="uniform")
    agg = DPAggregator(1.0, 1.0, 0.0, weights)
    omegas = torch.randn(3, 4, dtype=torch.float64)
    with pytest.raises(TypeError) as err:
        agg.aggregate(omegas, round=1, reported=torch.ones(3), generator=torch.Generator().manual_seed(0))
    assert "`reported` must be a boolean tensor" in _one_line(err)
    out = agg.aggregate(omegas, round=1, reported=torch.ones(3, dtype=torch.bool), generator=torch.Generator())
    assert out.shape == (1, 4)


def test_messages_on_a_map_of_another_dimension_than_the_model_are_refused_up_front():
    gp = SingleTaskGP(X, Y)
    rff3 = RandomFourierFeatures(3, 8, 0.3)
    peers = RFFBayesianLinear(rff3, torch.rand(4, 3, dtype=torch.float64), torch.rand(4, 1, dtype=torch.float64), 0.1)
    with pytest.raises(ValueError) as err:
        FederatedThompsonSampling(gp, peers.messages(), rff3, p_t=0.0)
    assert "`features` is a 3-dimensional map but `model` was trained on 2-dimensional inputs" in _one_line(err)


def test_a_summary_path_in_a_missing_folder_is_refused_before_the_run(tmp_path):
    pytest.importorskip("flwr")
    from fbo_torch.flower import server_app
    from fbo_torch.flower.config import FlowerRunConfig

    cfg = FlowerRunConfig.from_run_config({"num-agents": 2, "summary-path": str(tmp_path / "nowhere" / "s.json")})
    with pytest.raises(ValueError) as err:
        server_app.run_federation(None, cfg)  # refused before it touches the grid
    assert "run config `summary-path`" in _one_line(err) and "does not exist on the server" in str(err.value)
    server_app.check_summary_path(str(tmp_path / "s.json"))
