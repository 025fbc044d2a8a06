"""Tests of the batched CNN trainer, the agent partition and the image objectives."""

import math
import struct
import sys
from typing import NamedTuple

import numpy as np
import pytest
import torch

from fbo_torch.objectives.cnn import (
    SmallCNN,
    TrainerOptions,
    lr_schedule,
    stacked_cnn_forward,
    train_cnn_batched,
    train_cnn_single,
)
from fbo_torch.objectives.vision import (
    EMNISTCNN,
    HYPERPARAMETER_RANGE,
    DigitsCNN,
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


def _serve_emnist_zip(folder, raw):
    """NIST's gzip.zip layout (gzip/emnist-*.gz) of the idx files in ``raw``, served on 127.0.0.1; returns
    (url, md5 of the archive, server)."""
    import gzip
    import hashlib
    import http.server
    import threading
    import zipfile

    archive = folder / "gzip.zip"
    with zipfile.ZipFile(archive, "w") as z:
        for f in sorted(raw.iterdir()):
            z.writestr(f"gzip/{f.name}.gz", gzip.compress(f.read_bytes()))
    handler = lambda *a, **k: http.server.SimpleHTTPRequestHandler(*a, directory=str(folder), **k)  # noqa: E731
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/gzip.zip"
    return url, hashlib.md5(archive.read_bytes()).hexdigest(), server


def test_the_emnist_download_command_fetches_checks_and_lays_out_the_files(tmp_path, monkeypatch, capsys):
    """`fbo-torch data emnist --root DIR` downloads NIST's archive through torchvision (via the compatibility
    layer), checks its MD5, unpacks it where EMNISTCNN reads, and says how to use it. Offline: a generated
    archive in NIST's layout, served on 127.0.0.1 (--url), its MD5 given to torchvision's check."""
    from fbo_torch.cli import main

    raw = _write_fake_emnist(tmp_path / "made")
    url, md5, server = _serve_emnist_zip(tmp_path, raw)
    tv = import_torchvision()
    try:
        monkeypatch.setattr(tv.datasets.EMNIST, "md5", "0" * 32)
        assert main(["data", "emnist", "--root", str(tmp_path / "data"), "--url", url]) == 1  # wrong checksum
        assert "error: downloading EMNIST into" in capsys.readouterr().err
        monkeypatch.setattr(tv.datasets.EMNIST, "md5", md5)
        assert main(["data", "emnist", "--root", str(tmp_path / "data"), "--url", url]) == 0
    finally:
        server.shutdown()
    out = capsys.readouterr().out
    assert "200 training and 40 test images" in out and f"FBO_EMNIST_ROOT={tmp_path / 'data'}" in out
    f = EMNISTCNN(tmp_path / "data", num_agents=2, samples_per_agent=30, min_samples_per_agent=20, steps=2)
    assert f.images.shape[1:] == (1, 28, 28)


def test_emnist_missing_data_raises_clear_error(tmp_path, monkeypatch):
    how = r"fbo-torch data emnist(.|\n)*user data folder(.|\n)*FBO_EMNIST_ROOT"
    with pytest.raises(FileNotFoundError, match="nowhere(.|\n)*" + how):
        EMNISTCNN(tmp_path / "nowhere", num_agents=2)
    monkeypatch.delenv("FBO_EMNIST_ROOT", raising=False)
    monkeypatch.setenv("FBO_DATA_DIR", str(tmp_path / "my-data"))  # the user data folder, not site-packages
    with pytest.raises(FileNotFoundError, match="my-data(.|\n)*" + how):
        EMNISTCNN(num_agents=2)
    monkeypatch.setenv("FBO_EMNIST_ROOT", str(tmp_path / "elsewhere"))
    with pytest.raises(FileNotFoundError, match="elsewhere"):
        EMNISTCNN(num_agents=2)


def test_emnist_root_from_environment(tmp_path, monkeypatch):
    _write_fake_emnist(tmp_path)
    monkeypatch.setenv("FBO_EMNIST_ROOT", str(tmp_path))
    f = EMNISTCNN(num_agents=2, samples_per_agent=30, min_samples_per_agent=20, steps=2, channels=(2, 4))
    assert f.root == str(tmp_path) and f.images.shape[1:] == (1, 28, 28)


def test_image_objective_device_and_trainer_options():
    f = DigitsCNN(num_agents=2, steps=5, channels=(4, 8), trainer={"dtype": "float64"}, device="cpu")
    assert f.trainer_options == TrainerOptions(dtype=torch.float64) and f.device == torch.device("cpu")
    Y = f(torch.rand(2, 1, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0)))
    assert Y.shape == (2, 1) and ((Y >= 0) & (Y <= 1)).all()
    with pytest.raises(ValueError, match="`trainer` has unknown keys"):
        DigitsCNN(num_agents=2, trainer={"dtyp": "float64"})
    with pytest.raises(ValueError, match="`device`"):
        DigitsCNN(num_agents=2, device="gpu0")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="`device` is 'cuda' but no CUDA device"):
            DigitsCNN(num_agents=2, device="cuda")


def test_the_run_device_reaches_image_objectives_unless_the_config_names_one(monkeypatch):
    from fbo_torch.objectives import build_objective, vision

    seen = []
    monkeypatch.setattr(vision, "_check_device", lambda d: seen.append(d) or torch.device("cpu"))
    spec = {"type": "digits_cnn", "num_agents": 2, "steps": 5, "channels": [4, 8]}
    build_objective(spec, device="cuda")  # `--device cuda` / `device: cuda`
    build_objective({**spec, "device": "cpu"}, device="cuda")  # objective.device wins
    build_objective(spec)  # no run device: the objective's default
    assert seen == ["cuda", "cpu", None]
    # objectives without a device argument are built as before
    assert build_objective({"type": "gp_grid", "agents_per_group": 2, "grid_size": 20}, device="cuda").num_agents == 2


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


# Tolerances of the trainer comparisons.
#
# Two implementations of the same SGD run (the batched trainer and the plain
# loop, CPU and CUDA, AVX2 and AVX-512 kernels) differ only by floating-point
# rounding: every step injects relative errors of order u (unit roundoff,
# 2^-53 ~ 1.1e-16 in float64, 2^-24 ~ 6e-8 in float32) times the number of
# terms summed in a gradient entry, and the SGD map amplifies earlier errors by
# the norm of its Jacobian product. The product (terms x amplification) is a
# property of the training run, not of the dtype; float32 runs of these tests
# have shown parameter differences of up to 3e-4 on CUDA and 6e-5 on AVX-512,
# i.e. 3e-4 / 6e-8 = 5e3 units of roundoff. The exact-equivalence tests
# therefore compare in float64, where the same factor gives 5e3 x 1.1e-16
# ~ 6e-13; ATOL_F64 = 1e-9 leaves a further factor of ~1e3 for other machines'
# kernels (different summation orders, FMA) while still catching any real
# difference in the maths (a wrong step, a wrong penalty, a swapped minibatch
# give differences of order lr x gradient ~ 1e-4 or more after one step).
ATOL_F64 = 1e-9
F64 = TrainerOptions(dtype=torch.float64)


def test_batched_single_configuration_equals_plain_loop(digits):
    X, y = digits
    net = SmallCNN(image_size=8)
    tr, va = _split(len(y), 0, 300, 100)
    acc_s, model = train_cnn_single(
        net, X, y, tr, va, lr=0.02, lr_decay=1e-3, l2=1e-4, seed=7, steps=60, dtype=torch.float64
    )
    acc_b, params = train_cnn_batched(
        net,
        X,
        y,
        [tr],
        [va],
        lr=[0.02],
        lr_decay=[1e-3],
        l2=[1e-4],
        seeds=[7],
        steps=60,
        return_params=True,
        options=F64,
    )
    assert acc_b.dtype == torch.float64 and all(p.dtype == torch.float64 for p in params.values())
    for name, p in model.named_parameters():
        torch.testing.assert_close(params[name][0], p.detach(), atol=ATOL_F64, rtol=0)
    assert acc_b.shape == (1,)
    assert acc_b.item() == acc_s  # float64 logits 1e-9 apart: no argmax flips
    assert acc_s > 0.3  # it learned something in 60 steps


def test_batched_k_configurations_equal_separate_runs(digits):
    X, y = digits
    net = SmallCNN(image_size=8, channels=(8, 16))
    # Different data sizes, hyperparameters and seeds per configuration.
    splits = [_split(len(y), s, nt, nv) for s, nt, nv in ((0, 80, 20), (1, 150, 37), (2, 45, 11))]
    lr, decay, l2, seeds = [0.02, 0.005, 1e-7], [0.01, 1e-7, 1e-3], [1e-3, 0.02, 1e-7], [3, 4, 3]
    acc_b, params = train_cnn_batched(
        net,
        X,
        y,
        [s[0] for s in splits],
        [s[1] for s in splits],
        lr,
        decay,
        l2,
        seeds,
        steps=40,
        batch_size=16,
        return_params=True,
        options=F64,
    )
    assert acc_b.shape == (3,)
    for k, (tr, va) in enumerate(splits):
        acc_s, model = train_cnn_single(
            net, X, y, tr, va, lr[k], decay[k], l2[k], seeds[k], steps=40, batch_size=16, dtype=torch.float64
        )
        for name, p in model.named_parameters():
            torch.testing.assert_close(params[name][k], p.detach(), atol=ATOL_F64, rtol=0)
        assert acc_b[k].item() == acc_s


def test_float32_trajectory_within_roundoff_bound_of_float64(digits):
    r"""The default float32 trainer follows the float64 trajectory within a bound derived from float32's roundoff.

    Per step, float32 rounds (a) every parameter update, relative error
    ``u = 2^-24`` of ``|θ|``: over ``T`` steps at most ``T u max|θ|`` without
    amplification; and (b) every gradient entry, a sum of at most
    ``n = batch x H x W`` products (the first convolution's weight gradient,
    the largest reduction of a step), whose independent roundings grow like
    ``sqrt(n) u`` relative to the update. How much this run amplifies relative
    perturbations ``u`` of the updates is *measured in float64* (so the same on
    every machine to ~1e-9): ``D`` = departure of the run with learning rates
    ``lr (1 + u)`` from the run with ``lr``. Bound per parameter tensor:
    ``sqrt(n) D + T u max|θ|``. A wrong float32 code path (different maths)
    departs by ~1e-3 or more and fails.
    """
    r = _reference_run(digits)
    _, p32 = train_cnn_batched(r.net, r.X, r.y, r.tr, r.va, lr=r.lr, **r.kw)
    _assert_within_float32_roundoff(p32, r.p64, r.pert, r.kw["steps"], n_terms=r.kw["batch_size"] * 8 * 8)


class _Reference(NamedTuple):
    net: SmallCNN
    X: torch.Tensor
    y: torch.Tensor
    tr: list
    va: list
    lr: torch.Tensor
    kw: dict
    acc64: torch.Tensor
    p64: dict
    pert: dict


def _reference_run(digits) -> _Reference:
    """Four configurations trained in float64 on the CPU, and again with learning rates ``lr (1 + 2^-24)``."""
    X, y = digits
    net = SmallCNN(image_size=8)
    splits = [_split(len(y), s, 120, 40) for s in range(4)]
    tr, va = [s[0] for s in splits], [s[1] for s in splits]
    steps, batch, u = 50, 32, 2.0**-24
    lr = torch.tensor([0.02, 0.01, 1e-3, 1e-7], dtype=torch.float64)
    kw = dict(
        lr_decay=[1e-3, 0.0, 0.01, 1e-4],
        l2=[1e-4, 1e-6, 0.0, 1e-3],
        seeds=[0, 1, 2, 3],
        steps=steps,
        batch_size=batch,
        return_params=True,
    )
    acc64, p64 = train_cnn_batched(net, X, y, tr, va, lr=lr, options=F64, **kw)
    _, pert = train_cnn_batched(net, X, y, tr, va, lr=lr * (1 + u), options=F64, **kw)
    return _Reference(net, X, y, tr, va, lr, kw, acc64, p64, pert)


def _assert_within_float32_roundoff(p32, p64, pert, steps, n_terms):
    """``|p32 - p64| <= sqrt(n_terms) D + steps u max|θ|`` per tensor (see the test above)."""
    u = 2.0**-24
    for name in p64:
        assert p32[name].dtype == torch.float32
        D = (pert[name] - p64[name]).abs().max()
        bound = math.sqrt(n_terms) * D + steps * u * p64[name].abs().max()
        err = (p32[name].double().cpu() - p64[name]).abs().max()
        assert err <= bound, (name, err.item(), bound.item())


def test_bf16_autocast_accuracy_close_to_float32(digits):
    r"""bf16 autocast (float32 master weights) trains networks as accurate as float32 ones.

    Stated tolerance: over ``K = 4`` well-trained configurations, each with
    ``nv = 60`` validation images, the mean validation accuracy under bf16
    autocast is within 0.05 of float32's, and every configuration within 0.1
    (6 of 60 images). bf16 rounds activations and products to 8 bits of
    mantissa (relative 2^-9 ~ 2e-3), so the trajectory departs from float32's
    and the two networks are different, equally good draws: their accuracies
    differ by the images near the decision boundary, a few of ``nv``.
    """
    X, y = digits
    net = SmallCNN(image_size=8)
    splits = [_split(len(y), s, 300, 60) for s in range(4)]
    args = dict(
        lr=[0.02, 0.02, 0.015, 0.02],
        lr_decay=[1e-4, 1e-3, 0.0, 1e-4],
        l2=[1e-6, 1e-5, 0.0, 1e-4],
        seeds=[0, 1, 2, 3],
        steps=120,
    )
    tr, va = [s[0] for s in splits], [s[1] for s in splits]
    acc32 = train_cnn_batched(net, X, y, tr, va, **args)
    acc16 = train_cnn_batched(net, X, y, tr, va, options=TrainerOptions(autocast_dtype=torch.bfloat16), **args)
    assert acc16.dtype == torch.float32  # master weights and metric stay float32
    assert acc32.min() > 0.6  # trained: the comparison is between good networks
    assert (acc16 - acc32).abs().max() <= 0.1 + 1e-6
    assert abs(acc16.mean() - acc32.mean()) <= 0.05 + 1e-6


_HOST_READS = {
    "item",
    "tolist",
    "numpy",
    "cpu",
    "__bool__",
    "__int__",
    "__float__",
    "__index__",
    "nonzero",
    "masked_select",
    "unique",
    "argwhere",
    "any",
    "all",
}


def test_training_steps_never_read_back_to_the_host(digits, monkeypatch):
    """Between the first and the last SGD step nothing is read back to the host.

    On CUDA each of these reads (``.item()``, ``bool(t)``, ``.cpu()``,
    data-dependent shapes such as ``nonzero``) would wait for the GPU; on the CPU
    they are intercepted with a :class:`~torch.overrides.TorchFunctionMode`
    around :meth:`_StackedSGD.run`, which sees every tensor method call.
    """
    from torch.overrides import TorchFunctionMode

    from fbo_torch.objectives import cnn

    seen = []

    class HostReads(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if getattr(func, "__name__", "") in _HOST_READS:
                seen.append(func.__name__)
            return func(*args, **(kwargs or {}))

    run = cnn._StackedSGD.run
    calls = []

    def watched(self, steps):
        calls.append(steps)
        with HostReads():
            run(self, steps)

    monkeypatch.setattr(cnn._StackedSGD, "run", watched)
    X, y = digits
    tr, va = _split(len(y), 0, 100, 30)
    net = SmallCNN(image_size=8, channels=(4, 8))
    acc = train_cnn_batched(net, X, y, [tr, tr], [va, va], [0.01, 0.02], 1e-3, 1e-4, [0, 1], steps=7)
    assert calls == [7] and acc.shape == (2,)
    assert seen == []
    # The interception works: a host read inside the steps is caught.
    with HostReads():
        torch.ones(2).sum().item()
    assert seen == ["item"]


def test_trainer_options_check_arguments():
    assert TrainerOptions(dtype="float64").dtype == torch.float64
    assert TrainerOptions(autocast_dtype="bf16").autocast_dtype == torch.bfloat16
    with pytest.raises(ValueError, match="dtype"):
        TrainerOptions(dtype="int8")
    with pytest.raises(ValueError, match="autocast_dtype"):
        TrainerOptions(dtype=torch.float64, autocast_dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="allow_tf32"):
        TrainerOptions(allow_tf32="yes")
    with pytest.raises(TypeError, match="options"):
        train_cnn_batched(
            SmallCNN(image_size=8),
            torch.rand(4, 1, 8, 8),
            torch.zeros(4, dtype=torch.long),
            [torch.arange(2)],
            [torch.arange(2, 4)],
            0.01,
            0.0,
            0.0,
            [0],
            options={"dtype": "float64"},
        )
    cpu = torch.device("cpu")
    assert TrainerOptions().use_channels_last(cpu) and not TrainerOptions().use_cuda_graph(cpu)


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
    assert all(torch.equal(p.train, q.train) and torch.equal(p.val, q.val) for p, q in zip(parts, again, strict=True))
    other = dirichlet_label_partition(y, **{**kw, "seed": 6})
    assert not all(torch.equal(p.train, q.train) for p, q in zip(parts, other, strict=True))
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
@pytest.mark.parametrize("cuda_graph", [True, False])
def test_batched_trainer_cuda_matches_cpu(digits, cuda_graph):
    """CUDA (deterministic cuDNN, TF32 off) runs the CPU's trajectory: float64 to ATOL_F64, float32 within roundoff."""
    net, X, y, tr, va, lr, kw, acc_c, p_c, pert = _reference_run(digits)
    dev = torch.device("cuda")
    Xg, yg = X.to(dev), y.to(dev)
    flags = (torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic)
    opts = dict(deterministic=True, allow_tf32=False, cuda_graph=cuda_graph)
    acc_g, p_g = train_cnn_batched(net, Xg, yg, tr, va, lr=lr, options=TrainerOptions(dtype="float64", **opts), **kw)
    assert (torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic) == flags  # restored
    assert acc_g.device.type == "cuda" and all(p.device.type == "cuda" for p in p_g.values())
    for name in p_c:
        torch.testing.assert_close(p_g[name].cpu(), p_c[name], atol=ATOL_F64, rtol=0)
    assert torch.equal(acc_g.cpu(), acc_c)
    _, p32 = train_cnn_batched(net, Xg, yg, tr, va, lr=lr, options=TrainerOptions(**opts), **kw)
    _assert_within_float32_roundoff(p32, p_c, pert, kw["steps"], n_terms=kw["batch_size"] * 8 * 8)
    # The fast settings (bf16 autocast, TF32, channels-last) run; accuracies stay near the
    # float64 ones (0.25 = 10 of 40 validation images: loose, these networks train 50 steps).
    acc_fast = train_cnn_batched(
        net,
        Xg,
        yg,
        tr,
        va,
        lr=lr,
        options=TrainerOptions(autocast_dtype="bf16", allow_tf32=True, cuda_graph=cuda_graph),
        **{**kw, "return_params": False},
    )
    assert (acc_fast.cpu() - acc_c.float()).abs().max() <= 0.25


@pytest.mark.cuda
def test_digits_objective_trains_on_cuda():
    f = DigitsCNN(num_agents=3, steps=30, device="cuda")
    assert f.images.device.type == "cuda" and f.labels.device.type == "cuda"
    Xq = torch.rand(3, 2, 3, dtype=torch.float64)
    assert f(Xq).device.type == "cpu"  # values follow X's device
    assert f(Xq.to("cuda")).device.type == "cuda"


def test_custom_search_space_and_native_configs():
    from fbo_torch.objectives.search_space import Real, SearchSpace

    space = SearchSpace(
        [
            Real("l2", 1e-6, 1e-2, log=True),
            Real("learning_rate", 1e-3, 0.1, log=True),
            Real("lr_decay", 1e-6, 1e-2, log=True),
        ]
    )
    f = DigitsCNN(num_agents=2, steps=5, channels=(4, 8), search_space=space)
    X = torch.tensor([[[0.0, 1.0, 0.5]], [[1.0, 0.0, 0.0]]], dtype=torch.float64)
    H = f.hyperparameters(X)  # (learning_rate, lr_decay, l2) order
    torch.testing.assert_close(H[0, 0], torch.tensor([0.1, 1e-4, 1e-6], dtype=torch.float64))
    torch.testing.assert_close(f.inputs_from_hyperparameters(H), X)
    assert f.native_configs(X)[1][0]["l2"] == pytest.approx(1e-2)
    assert f(X).shape == (2, 1)
    with pytest.raises(ValueError, match="exactly the parameters"):
        DigitsCNN(num_agents=2, search_space=SearchSpace([Real("lr", 1e-3, 0.1)]))


# --------------------------------------------------------------------------- benchmark
def test_cnn_training_benchmark_quick(tmp_path):
    """``benchmarks/cnn_training.py --quick`` runs end to end and writes a consistent JSON and plot."""
    import json
    import os
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [
            sys.executable,
            str(root / "benchmarks" / "cnn_training.py"),
            "--quick",
            "--threads",
            "1",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=root,
        env=dict(os.environ, MPLBACKEND="Agg"),
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads((tmp_path / "cnn_training_cpu_quick.json").read_text())
    assert (tmp_path / "cnn_training_cpu_quick.png").stat().st_size > 0
    s = data["settings"]
    assert s["quick"] and s["image"] == [1, 28, 28] and s["num_classes"] == 10 and "random" in s["data"]
    assert s["batch_size"] == 32 and s["channels"] == [16, 32]  # EMNISTCNN's defaults
    cells = data["cells"]
    assert {(c["K"], c["mode"]) for c in cells} == {(k, m) for k in s["K"] for m in ("plain", "batched")}
    for c in cells:
        assert c["round_s"] > 0 and c["peak_memory_bytes"] > 0
        assert math.isclose(c["configs_per_s"], c["K"] / c["round_s"], rel_tol=1e-9)
        assert c["extrapolated"] == (c["timed_configs"] < c["K"])
    assert data["summary"]["batched_K1_over_plain"] > 0
