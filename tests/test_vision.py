"""Tests of the batched CNN trainer, the agent partition and the image objectives."""

import math
import struct
import sys

import numpy as np
import pytest
import torch

from fbo_torch.objectives.cnn import (
    SmallCNN,
    lr_schedule,
    stacked_cnn_forward,
    train_cnn_batched,
    train_cnn_single,
)
from fbo_torch.objectives.vision import (
    HYPERPARAMETER_RANGE,
    DigitsCNN,
    EMNISTCNN,
    dirichlet_label_partition,
)
from fbo_torch.utils.torchvision_compat import import_torchvision


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    # Tiny convolutions: intra-op threading only adds overhead, and on a loaded
    # 2-core machine it slows these tests down by an order of magnitude.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def digits():
    from sklearn.datasets import load_digits

    d = load_digits()
    X = torch.as_tensor(d.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.as_tensor(d.target, dtype=torch.long)
    return X, y


@pytest.fixture(scope="module")
def digits_cnn():
    return DigitsCNN(num_agents=10, seed=0)


# --------------------------------------------------------------------------- torchvision
def test_import_torchvision_is_idempotent():
    tv = import_torchvision()
    assert import_torchvision() is tv
    from torchvision.datasets import EMNIST

    assert tv.datasets.EMNIST is EMNIST
    assert hasattr(tv, "transforms") and hasattr(tv, "models")


def test_import_torchvision_missing_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchvision", None)
    with pytest.raises(ImportError, match=r"fbo_torch\[vision\]"):
        import_torchvision()


# --------------------------------------------------------------------------- EMNIST files
def _write_idx(path, array: np.ndarray) -> None:
    """Write an unsigned-byte idx file (the MNIST/EMNIST format)."""
    header = struct.pack(">BBBB", 0, 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    path.write_bytes(header + array.astype(np.uint8).tobytes())


def _write_fake_emnist(root, n_train=200, n_test=40, seed=0):
    """Tiny EMNIST 'digits' in torchvision's layout: root/EMNIST/raw/emnist-digits-*-ubyte."""
    rng = np.random.default_rng(seed)
    raw = root / "EMNIST" / "raw"
    raw.mkdir(parents=True)
    for part, n in (("train", n_train), ("test", n_test)):
        labels = rng.integers(0, 10, n)
        images = rng.integers(0, 40, (n, 28, 28))
        for i, c in enumerate(labels):  # a bright bar whose position encodes the digit
            images[i, 2 * c + 4 : 2 * c + 7, 4:24] = 255
        _write_idx(raw / f"emnist-digits-{part}-images-idx3-ubyte", images)
        _write_idx(raw / f"emnist-digits-{part}-labels-idx1-ubyte", labels)
    return raw


def test_emnist_objective_on_generated_idx_files(tmp_path):
    _write_fake_emnist(tmp_path)
    f = EMNISTCNN(tmp_path, num_agents=4, alpha=0.5, samples_per_agent=40, min_samples_per_agent=20, steps=15, seed=1)
    assert f.num_agents == 4 and f.dim == 3 and f.value_name == "accuracy"
    assert f.images.shape[1:] == (1, 28, 28)
    assert f.images.dtype == torch.float32 and 0.0 <= f.images.min() and f.images.max() <= 1.0
    assert f.images.max() == 1.0  # 255 -> 1
    sizes = f.agent_sizes()
    assert (sizes.sum(-1) >= 20).all() and sizes.sum() == f.images.shape[0] <= 200
    X = torch.rand(4, 2, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    Y = f(X)
    assert Y.shape == (4, 2) and Y.dtype == torch.float64
    assert ((Y >= 0) & (Y <= 1)).all()
    # The stored pool is the transposed (upright) raw data, scaled to [0, 1].
    tv = import_torchvision()
    raw = tv.datasets.EMNIST(str(tmp_path), split="digits", train=True).data
    np.testing.assert_allclose(f.images[:, 0].numpy(), raw[f.source_index].transpose(1, 2).numpy() / 255.0, atol=1e-7)
    # The test file can be partitioned too.
    g = EMNISTCNN(tmp_path, num_agents=2, samples_per_agent=15, min_samples_per_agent=10, steps=2, train=False)
    assert g.images.shape[0] <= 40


def test_emnist_missing_data_raises_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="download=True"):
        EMNISTCNN(tmp_path / "nowhere", num_agents=2)


# --------------------------------------------------------------------------- trainer
def _split(n, seed, n_train, n_val):
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    return perm[:n_train], perm[n_train : n_train + n_val]


def test_lr_schedule_is_keras_decay():
    s = lr_schedule(torch.tensor([0.02, 1e-3]), torch.tensor([0.5, 0.0]), steps=4)
    expected = torch.tensor([[0.02 / (1 + 0.5 * t), 1e-3] for t in range(4)])
    torch.testing.assert_close(s, expected)


def test_stacked_forward_matches_modules(digits):
    X, _ = digits
    net = SmallCNN(image_size=8)
    nets = [SmallCNN(image_size=8) for _ in range(3)]
    params, _ = torch.func.stack_module_state(nets)
    x = X[:30].reshape(3, 10, 1, 8, 8)
    out = stacked_cnn_forward(net, {k: v.detach() for k, v in params.items()}, x)
    for k in range(3):
        torch.testing.assert_close(out[k], nets[k](x[k]).detach(), atol=1e-5, rtol=1e-5)


def test_batched_single_configuration_equals_plain_loop(digits):
    X, y = digits
    net = SmallCNN(image_size=8)
    tr, va = _split(len(y), 0, 300, 100)
    acc_s, model = train_cnn_single(net, X, y, tr, va, lr=0.02, lr_decay=1e-3, l2=1e-4, seed=7, steps=60)
    acc_b, params = train_cnn_batched(
        net, X, y, [tr], [va], lr=[0.02], lr_decay=[1e-3], l2=[1e-4], seeds=[7], steps=60, return_params=True
    )
    for name, p in model.named_parameters():
        torch.testing.assert_close(params[name][0], p.detach(), atol=1e-5, rtol=1e-4)
    assert acc_b.shape == (1,)
    assert abs(acc_b.item() - acc_s) <= 1.0 / len(va) + 1e-6  # at most one borderline image
    assert acc_s > 0.3  # it learned something in 60 steps


def test_batched_k_configurations_equal_separate_runs(digits):
    X, y = digits
    net = SmallCNN(image_size=8, channels=(8, 16))
    # Different data sizes, hyperparameters and seeds per configuration.
    splits = [_split(len(y), s, nt, nv) for s, nt, nv in ((0, 80, 20), (1, 150, 37), (2, 45, 11))]
    lr, decay, l2, seeds = [0.02, 0.005, 1e-7], [0.01, 1e-7, 1e-3], [1e-3, 0.02, 1e-7], [3, 4, 3]
    acc_b, params = train_cnn_batched(
        net, X, y, [s[0] for s in splits], [s[1] for s in splits], lr, decay, l2, seeds, steps=40, batch_size=16,
        return_params=True,
    )
    assert acc_b.shape == (3,)
    for k, (tr, va) in enumerate(splits):
        acc_s, model = train_cnn_single(net, X, y, tr, va, lr[k], decay[k], l2[k], seeds[k], steps=40, batch_size=16)
        for name, p in model.named_parameters():
            torch.testing.assert_close(params[name][k], p.detach(), atol=1e-5, rtol=1e-4)
        assert abs(acc_b[k].item() - acc_s) <= 1.0 / len(va) + 1e-6


def test_batched_trainer_is_deterministic_and_checks_arguments(digits):
    X, y = digits
    net = SmallCNN(image_size=8, channels=(4, 8))
    tr, va = _split(len(y), 0, 100, 30)
    a = train_cnn_batched(net, X, y, [tr, tr], [va, va], 0.01, 0.0, 0.0, [0, 1], steps=10)
    b = train_cnn_batched(net, X, y, [tr, tr], [va, va], 0.01, 0.0, 0.0, [0, 1], steps=10)
    assert torch.equal(a, b)
    with pytest.raises(ValueError, match="val_indices"):
        train_cnn_batched(net, X, y, [tr, tr], [va], 0.01, 0.0, 0.0, [0, 1])
    with pytest.raises(ValueError, match="seeds"):
        train_cnn_batched(net, X, y, [tr], [va], 0.01, 0.0, 0.0, [0, 1])
    with pytest.raises(ValueError, match="lr"):
        train_cnn_batched(net, X, y, [tr], [va], -1.0, 0.0, 0.0, [0])
    with pytest.raises(ValueError, match="images"):
        train_cnn_batched(SmallCNN(image_size=28), X, y, [tr], [va], 0.01, 0.0, 0.0, [0])
    with pytest.raises(TypeError, match="model"):
        train_cnn_batched(torch.nn.Linear(2, 2), X, y, [tr], [va], 0.01, 0.0, 0.0, [0])


# --------------------------------------------------------------------------- partition
def test_partition_disjoint_skewed_deterministic(digits):
    _, y = digits
    kw = dict(num_agents=8, alpha=0.3, samples_per_agent=120, min_samples_per_agent=30, seed=5)
    parts = dirichlet_label_partition(y, **kw)
    assert len(parts) == 8
    all_idx = torch.cat([torch.cat([p.train, p.val]) for p in parts])
    assert all_idx.unique().numel() == all_idx.numel()  # every sample used at most once
    assert all(p.train.numel() >= 1 and p.val.numel() >= 1 for p in parts)
    assert all(p.train.numel() + p.val.numel() >= 30 for p in parts)
    sizes = {p.train.numel() + p.val.numel() for p in parts}
    assert len(sizes) > 1  # heterogeneous sizes
    hist = torch.stack([torch.bincount(y[torch.cat([p.train, p.val])], minlength=10) for p in parts]).double()
    dist = hist / hist.sum(-1, keepdim=True)
    # Label skew: agents' label distributions differ a lot (total variation vs. the pooled mix).
    pooled = hist.sum(0) / hist.sum()
    tv = 0.5 * (dist - pooled).abs().sum(-1)
    assert tv.mean() > 0.3
    again = dirichlet_label_partition(y, **kw)
    assert all(torch.equal(p.train, q.train) and torch.equal(p.val, q.val) for p, q in zip(parts, again))
    other = dirichlet_label_partition(y, **{**kw, "seed": 6})
    assert not all(torch.equal(p.train, q.train) for p, q in zip(parts, other))
    # Large alpha: close to the pooled label mix.
    iid = dirichlet_label_partition(y, **{**kw, "alpha": 1e4})
    h = torch.stack([torch.bincount(y[torch.cat([p.train, p.val])], minlength=10) for p in iid]).double()
    assert (0.5 * (h / h.sum(-1, keepdim=True) - 0.1).abs().sum(-1)).mean() < tv.mean() / 2


def test_partition_checks_arguments(digits):
    _, y = digits
    with pytest.raises(ValueError, match="fewer than"):
        dirichlet_label_partition(y, num_agents=100, min_samples_per_agent=20)
    with pytest.raises(ValueError, match="alpha"):
        dirichlet_label_partition(y, num_agents=2, alpha=0.0)
    with pytest.raises(ValueError, match="val_fraction"):
        dirichlet_label_partition(y, num_agents=2, val_fraction=1.0)
    # Oversubscribed sizes are scaled down to fit.
    parts = dirichlet_label_partition(y, num_agents=10, samples_per_agent=400, min_samples_per_agent=20)
    assert sum(p.train.numel() + p.val.numel() for p in parts) <= len(y)


# --------------------------------------------------------------------------- DigitsCNN
def _x(f, lr, decay=1e-4, l2=1e-6):
    return f.inputs_from_hyperparameters(torch.tensor([lr, decay, l2], dtype=torch.float64))


def test_hyperparameter_map_is_log_uniform(digits_cnn):
    f = digits_cnn
    lo, hi = HYPERPARAMETER_RANGE
    H = f.hyperparameters(torch.tensor([[0.0, 0.5, 1.0]], dtype=torch.float64))
    torch.testing.assert_close(H, torch.tensor([[lo, math.sqrt(lo * hi), hi]], dtype=torch.float64))
    x = torch.rand(5, 3, dtype=torch.float64)
    torch.testing.assert_close(f.inputs_from_hyperparameters(f.hyperparameters(x)), x)
    assert f.bounds.tolist() == [[0.0] * 3, [1.0] * 3]


def test_digits_good_beats_bad_and_shapes(digits_cnn):
    f = digits_cnn
    k = f.num_agents
    X = torch.stack([_x(f, 0.02), _x(f, 1e-7)]).unsqueeze(0).expand(k, 2, 3)
    Y = f(X)
    assert Y.shape == (k, 2) and Y.dtype == torch.float64
    good, bad = Y[:, 0], Y[:, 1]
    assert good.mean() > 0.65 and bad.mean() < 0.3
    assert (good > bad).all()
    torch.testing.assert_close(f.loss(Y), 1 - Y)
    assert f.loss_name == "validation error"


def test_digits_deterministic_and_agent_subsets(digits_cnn):
    f = digits_cnn
    agents = torch.tensor([7, 2])
    X = torch.rand(2, 3, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    Y1 = f(X, agents)
    assert Y1.shape == (2, 3)
    assert torch.equal(Y1, f.evaluate_true(X, agents))  # fixed training seeds: a deterministic function
    g = DigitsCNN(num_agents=10, seed=0)
    assert torch.equal(Y1, g(X, agents))
    # The value of (agent, x) does not depend on what else is in the batch.
    torch.testing.assert_close(Y1[1:, :1], f(X[1:, :1], agents[1:]))
    assert torch.equal(f.agent_label_histograms(), g.agent_label_histograms())
    h = DigitsCNN(num_agents=10, seed=1)
    assert not torch.equal(f.agent_label_histograms(), h.agent_label_histograms())
    hist = f.agent_label_histograms()
    assert hist.shape == (10, 10) and hist.sum() == f.images.shape[0]


def test_digits_checks_inputs(digits_cnn):
    f = digits_cnn
    with pytest.raises(ValueError, match="shape"):
        f(torch.rand(3, 1, 3, dtype=torch.float64))
    with pytest.raises(ValueError, match="bounds"):
        f(torch.full((10, 1, 3), 1.5, dtype=torch.float64))


def test_digits_max_configs_per_batch_gives_same_values():
    f = DigitsCNN(num_agents=3, steps=20, channels=(4, 8), seed=2)
    g = DigitsCNN(num_agents=3, steps=20, channels=(4, 8), seed=2, max_configs_per_batch=2)
    X = torch.rand(3, 2, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(f(X), g(X), atol=1.0 / 8, rtol=0)  # chunking only changes float rounding


# --------------------------------------------------------------------------- CUDA
@pytest.mark.cuda
def test_batched_trainer_cuda_matches_cpu(digits):
    X, y = digits
    net = SmallCNN(image_size=8)
    splits = [_split(len(y), s, 120, 40) for s in range(4)]
    args = dict(lr=[0.02, 0.01, 1e-3, 1e-7], lr_decay=[1e-3, 0.0, 0.01, 1e-4], l2=[1e-4, 1e-6, 0.0, 1e-3],
                seeds=[0, 1, 2, 3], steps=50, return_params=True)
    acc_c, p_c = train_cnn_batched(net, X, y, [s[0] for s in splits], [s[1] for s in splits], **args)
    dev = torch.device("cuda")
    prev = torch.backends.cudnn.deterministic
    torch.backends.cudnn.deterministic = True
    try:
        acc_g, p_g = train_cnn_batched(
            net, X.to(dev), y.to(dev), [s[0].to(dev) for s in splits], [s[1].to(dev) for s in splits], **args
        )
    finally:
        torch.backends.cudnn.deterministic = prev
    assert acc_g.device.type == "cuda" and all(p.device.type == "cuda" for p in p_g.values())
    for name in p_c:
        torch.testing.assert_close(p_g[name].cpu(), p_c[name], atol=1e-4, rtol=1e-3)
    assert (acc_g.cpu() - acc_c).abs().max() <= 1.0 / 40 + 1e-6
    f = DigitsCNN(num_agents=3, steps=30, device="cuda")
    Xq = torch.rand(3, 2, 3, dtype=torch.float64)
    assert f(Xq).device.type == "cpu"  # values follow X's device
    assert f(Xq.to(dev)).device.type == "cuda"


def test_custom_search_space_and_native_configs():
    from fbo_torch.objectives.search_space import Real, SearchSpace

    space = SearchSpace([Real("l2", 1e-6, 1e-2, log=True), Real("learning_rate", 1e-3, 0.1, log=True),
                         Real("lr_decay", 1e-6, 1e-2, log=True)])
    f = DigitsCNN(num_agents=2, steps=5, channels=(4, 8), search_space=space)
    X = torch.tensor([[[0.0, 1.0, 0.5]], [[1.0, 0.0, 0.0]]], dtype=torch.float64)
    H = f.hyperparameters(X)  # (learning_rate, lr_decay, l2) order
    torch.testing.assert_close(H[0, 0], torch.tensor([0.1, 1e-4, 1e-6], dtype=torch.float64))
    torch.testing.assert_close(f.inputs_from_hyperparameters(H), X)
    assert f.native_configs(X)[1][0]["l2"] == pytest.approx(1e-2)
    assert f(X).shape == (2, 1)
    with pytest.raises(ValueError, match="exactly the parameters"):
        DigitsCNN(num_agents=2, search_space=SearchSpace([Real("lr", 1e-3, 0.1)]))
