import re
import shutil

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fbo_torch.objectives.har import HAR_URL, HARLogReg, load_har

f64 = torch.float64
P = 561


def _fmt(a: np.ndarray) -> str:
    # the real files write e.g. "  2.8858451e-001 -2.0294171e-002": 3-digit exponents, space padded
    txt = np.array2string(a, separator=" ", formatter={"float_kind": lambda v: f"{v:15.7e}"}, max_line_width=10**9)
    return re.sub(r"e([+-])(\d\d)\b", r"e\g<1>0\2", txt.strip("[]"))


def write_har(root, layout, p=P, seed=0, sep=6.0):
    """Write UCI HAR files: ``layout = {"train": {subject: rows}, "test": {...}}``.

    Features have class-dependent means (plus a per-subject shift), so LR can learn.
    """
    rng = np.random.default_rng(seed)
    means = rng.normal(size=(6, p)) * sep / np.sqrt(p)
    shift = {s: rng.normal(0, 0.3, size=p) for part in layout.values() for s in part}
    for split, subjects in layout.items():
        d = root / split
        d.mkdir(parents=True, exist_ok=True)
        lines, ys, ss = [], [], []
        for s, n in subjects.items():
            lab = np.resize(np.arange(1, 7), n)
            rng.shuffle(lab)
            X = means[lab - 1] + shift[s] + rng.normal(size=(n, p))
            lines += [_fmt(r) for r in X]
            ys += [str(v) for v in lab]
            ss += [str(s)] * n
        (d / f"X_{split}.txt").write_text("\n".join(lines) + "\n")
        (d / f"y_{split}.txt").write_text("\n".join(ys) + "\n")
        (d / f"subject_{split}.txt").write_text("\n".join(ss) + "\n")
    return root


LAYOUT = {"train": {1: 40, 3: 44, 6: 20}, "test": {2: 42, 6: 22}}  # subject 6 in both parts


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return write_har(tmp_path_factory.mktemp("har") / "UCI HAR Dataset", LAYOUT)


@pytest.fixture(scope="module")
def obj(root):
    return HARLogReg(root)


def good_config(o, k, q=1, batch_size=20, l2=1e-4, lr=0.05):
    u = o.search_space.from_values({"batch_size": batch_size, "l2": l2, "learning_rate": lr})
    return u.expand(k, q, 3).clone()


def test_load(root, obj):
    X, y, s = load_har(root)
    assert X.shape == (168, P) and y.shape == s.shape == (168,)
    assert set(y.tolist()) == set(range(1, 7)) and sorted(set(s.tolist())) == [1, 2, 3, 6]
    assert X[0, 0] == pytest.approx(float((root / "train/X_train.txt").read_text().split()[0]))
    assert obj.num_agents == 4 and obj.subjects == [1, 2, 3, 6]  # sorted ids, train + test pooled
    assert obj.subject_sizes == [40, 42, 44, 42]
    assert all(abs(a - b) <= 3 for a, b in zip(obj.train_sizes, obj.val_sizes, strict=True))
    assert obj.num_features == P and obj.num_classes == 6 and obj.classes == [1, 2, 3, 4, 5, 6]
    assert obj.dim == 3 and obj.bounds.shape == (2, 3)
    assert obj.search_space.names == ["batch_size", "l2", "learning_rate"]
    assert obj.search_space["batch_size"].is_integer and obj.search_space["l2"].log
    Xtr, ytr, Xva, yva = obj.subject_data(0)
    assert Xtr.shape == (obj.train_sizes[0], P) and Xva.shape == (obj.val_sizes[0], P)
    np.testing.assert_allclose(Xtr.mean(0), 0, atol=1e-10)  # standardized with training statistics
    np.testing.assert_allclose(Xtr.std(0), 1, atol=1e-10)
    assert set(ytr.tolist()) == set(yva.tolist()) == set(range(6))  # stratified, 0-based
    # the parent folder of "UCI HAR Dataset" works too; a subset keeps the given order
    sub = HARLogReg(root.parent, subjects=[6, 2])
    assert sub.subjects == [6, 2] and sub.subject_sizes == [42, 42]
    assert obj.value_name == "accuracy" and obj.loss_name == "validation error"


def test_accuracy_deterministic_and_above_chance(root, obj):
    X = good_config(obj, 4)
    acc = obj(X)
    assert acc.shape == (4, 1) and acc.dtype == f64
    assert torch.equal(acc, obj(X)) and torch.equal(acc, obj.evaluate_true(X))
    assert torch.equal(acc, HARLogReg(root)(X))  # a fresh instance agrees
    assert (acc > 0.6).all() and acc.mean() > 0.7  # chance is 1/6
    torch.testing.assert_close(obj.loss(acc.squeeze(-1)), 1 - acc.squeeze(-1))
    # float32 inputs give float32 outputs
    assert obj(X.float()).dtype == torch.float32
    # seeds change the function, and so do the hyperparameters
    assert not torch.equal(HARLogReg(root, split_seed=1)(X), acc)
    gen = torch.Generator().manual_seed(3)
    many = obj(torch.rand(4, 6, 3, generator=gen, dtype=f64))
    assert (many.amax(-1) > many.amin(-1)).any()


def test_batched_equals_single_and_reference_sgd(obj):
    gen = torch.Generator().manual_seed(0)
    X = torch.rand(4, 3, 3, generator=gen, dtype=f64)
    X[0, 0, 0] = 0.0  # batch size 20: several steps per epoch
    acc = obj(X)
    # a configuration's value does not depend on what it is batched with
    for a in range(4):
        for j in range(3):
            single = obj(X[a : a + 1, j : j + 1], agents=torch.tensor([a]))
            assert torch.equal(single.squeeze(), acc[a, j])
    # ... and equals plain per-model minibatch SGD (torch.optim.SGD, weight_decay on W only)
    cfgs = obj.native_configs(X)
    for a, j in [(0, 0), (1, 1), (2, 2), (3, 0)]:
        c = cfgs[a][j]
        Xtr, ytr, Xva, yva = (torch.tensor(v) for v in obj.subject_data(a))
        W = torch.zeros(P, 6, dtype=f64, requires_grad=True)
        b = torch.zeros(6, dtype=f64, requires_grad=True)
        opt = torch.optim.SGD(
            [{"params": [W], "weight_decay": c["l2"]}, {"params": [b], "weight_decay": 0.0}],
            lr=c["learning_rate"],
        )
        n = len(ytr)
        for e in range(obj.epochs):
            perm = obj._perms[a, e, :n]
            for s in range(0, n, c["batch_size"]):
                idx = perm[s : s + c["batch_size"]]
                opt.zero_grad()
                F.cross_entropy(Xtr[idx] @ W + b, ytr[idx]).backward()
                opt.step()
        ref = ((Xva @ W + b).argmax(-1) == yva).double().mean().item()
        assert acc[a, j].item() == pytest.approx(ref, abs=1e-12), (a, j, c)


def test_options_and_errors(root, obj):
    o = HARLogReg(root, subjects=torch.tensor([3]), epochs=3, train_seed=5, dtype=torch.float32, chunk_size=2)
    v = o(torch.rand(1, 5, 3, dtype=f64))
    assert v.shape == (1, 5) and ((v >= 0) & (v <= 1)).all()
    custom = HARLogReg(
        root,
        subjects=[1],
        search_space={
            "learning_rate": {"low": 0.001, "high": 0.5, "log": True},
            "batch_size": {"low": 8, "high": 16, "type": "int"},
            "l2": {"low": 1e-8, "high": 1e-2, "log": True},
        },
    )
    assert custom.native_configs(torch.ones(1, 1, 3, dtype=f64)) == [
        [{"learning_rate": 0.5, "batch_size": 16, "l2": 1e-2}]
    ]
    with pytest.raises(ValueError, match="Integer parameter"):
        HARLogReg(
            root,
            search_space={
                "batch_size": {"low": 8, "high": 16},
                "l2": {"low": 0, "high": 1},
                "learning_rate": {"low": 0.01, "high": 0.1},
            },
        )
    with pytest.raises(ValueError, match="exactly the parameters"):
        HARLogReg(root, search_space={"C": {"low": 1, "high": 2}})
    with pytest.raises(ValueError, match=r"`subjects` \[7\] are not in the data"):
        HARLogReg(root, subjects=[1, 7])
    with pytest.raises(ValueError, match="must not repeat"):
        HARLogReg(root, subjects=[1, 1])
    with pytest.raises(ValueError, match="`epochs` must be >= 1"):
        HARLogReg(root, epochs=0)
    with pytest.raises(ValueError, match="outside the bounds"):
        obj(torch.full((4, 1, 3), 2.0, dtype=f64))
    with pytest.raises(ValueError, match="k x q x d = 4 x q x 3"):
        obj(torch.rand(4, 1, 2, dtype=f64))


def test_missing_files(tmp_path, root):
    with pytest.raises(FileNotFoundError) as e:
        HARLogReg(tmp_path)
    msg = str(e.value)
    assert HAR_URL in msg and "X_train.txt" in msg and "subject_test.txt" in msg
    partial = tmp_path / "partial"
    shutil.copytree(root, partial)
    (partial / "test" / "y_test.txt").unlink()
    with pytest.raises(FileNotFoundError) as e:
        HARLogReg(partial)
    missing = str(e.value).split("Download")[0]
    assert "y_test.txt" in missing and "X_train.txt" not in missing and HAR_URL in str(e.value)
    with pytest.raises(TypeError, match="`path` is required"):
        HARLogReg(None)
    # inconsistent row counts
    (partial / "test" / "y_test.txt").write_text("1\n2\n")
    with pytest.raises(ValueError, match="disagree on the number of rows"):
        HARLogReg(partial)
