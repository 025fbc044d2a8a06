import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from fbo_torch.objectives.landmine import LANDMINE_ENV, LANDMINE_URL, LandmineSVM, resolve_landmine_path
from fbo_torch.objectives.search_space import SearchSpace

DATA = Path(__file__).resolve().parents[2].parent / "shared/data/LandmineData.mat"
pytestmark = pytest.mark.skipif(not DATA.is_file(), reason=f"landmine data not at {DATA}")

f64 = torch.float64


@pytest.fixture(scope="module")
def obj():
    return LandmineSVM(path=DATA)


def native(o, C, gamma, k, q=1, dtype=f64):
    u = o.search_space.from_values({"C": C, "gamma": gamma}, dtype=dtype)
    return u.expand(k, q, 2).clone()


def test_all_fields_load(obj):
    assert obj.num_agents == 29 and obj.fields == list(range(29))
    assert obj.num_features == 9 and obj.dim == 2
    sizes = obj.field_sizes
    assert len(sizes) == 29 and min(sizes) == 445 and max(sizes) == 690
    assert all(a + b == n and abs(a - b) <= 1 for a, b, n in zip(obj.train_sizes, obj.val_sizes, sizes, strict=True))
    rates = np.array(obj.positive_rates)
    assert rates.min() > 0.02 and rates.max() < 0.1 and abs(rates.mean() - 0.062) < 0.005
    Xtr, ytr, Xva, yva = obj.field_data(0)
    assert Xtr.shape[1] == Xva.shape[1] == 9 and set(np.unique(ytr)) == set(np.unique(yva)) == {0, 1}
    # stratified: the positive rate is the same in both halves up to one point
    assert abs(ytr.sum() - yva.sum()) <= 1
    torch.testing.assert_close(obj.bounds, torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=f64))
    assert obj.value_name == "AUC" and obj.loss_name == "1 - AUC" and obj.optimum is None


def test_auc_reasonable_deterministic_and_matches_sklearn(obj):
    X = native(obj, 1.0, 0.1, k=29)
    assert obj.native_configs(X)[3][0] == pytest.approx({"C": 1.0, "gamma": 0.1})
    v1 = obj(X)
    assert v1.shape == (29, 1) and v1.dtype == f64
    assert torch.equal(v1, obj.evaluate_true(X))  # deterministic, no noise
    assert torch.equal(v1, LandmineSVM(path=DATA)(X))  # a fresh instance agrees
    # the first six fields (the papers' target agents) are clearly above chance; a few of
    # the 29 fields are below 0.5 at this setting (AUC 0.44 at worst), the mean is ~0.67
    assert ((v1[:6] > 0.6) & (v1[:6] <= 1)).all()
    assert v1.mean() > 0.6 and ((v1 > 0) & (v1 <= 1)).all()
    assert (v1 > 0.5).float().mean() > 0.75
    # an independent computation for field 0 with the authors' split (random_state = 0)
    from scipy.io import loadmat
    from sklearn.metrics import roc_auc_score
    from sklearn.model_selection import train_test_split
    from sklearn.svm import SVC

    m = loadmat(DATA)
    f, y = m["feature"][0][0], m["label"][0][0]
    Xtr, Xva, ytr, yva = train_test_split(f, y, test_size=0.5, stratify=y, random_state=0)
    ref = roc_auc_score(yva.ravel(), SVC(C=1.0, gamma=0.1).fit(Xtr, ytr.ravel()).decision_function(Xva))
    assert v1[0, 0].item() == pytest.approx(ref, abs=1e-12)
    assert v1[0, 0].item() == pytest.approx(0.7848, abs=1e-3)
    # loss is what the papers plot
    torch.testing.assert_close(obj.loss(v1.squeeze(-1)), 1 - v1.squeeze(-1))


def test_split_seed_and_standardize_change_the_function():
    X = native(LandmineSVM(path=DATA, fields=[0]), 1.0, 0.1, k=2)
    a = LandmineSVM(path=DATA, fields=[0, 1])(X)
    b = LandmineSVM(path=DATA, fields=[0, 1], split_seed=1)(X)
    c = LandmineSVM(path=DATA, fields=[0, 1], standardize=True)(X)
    assert not torch.equal(a, b) and not torch.equal(a, c)
    Xtr = LandmineSVM(path=DATA, fields=[4], standardize=True).field_data(0)[0]
    np.testing.assert_allclose(Xtr.mean(0), 0, atol=1e-10)


def test_batches_subsets_dtype(obj):
    sub = LandmineSVM(path=DATA, fields=torch.tensor([5, 0, 17]))
    assert sub.num_agents == 3 and sub.fields == [5, 0, 17]
    assert sub.field_sizes == [obj.field_sizes[i] for i in (5, 0, 17)]
    gen = torch.Generator().manual_seed(0)
    X = torch.rand(3, 2, 2, generator=gen, dtype=f64)
    v = sub(X)
    assert v.shape == (3, 2)
    # same (field, configuration) gives the same value through the full objective and `agents`
    full = obj(X, agents=torch.tensor([5, 0, 17]))
    assert torch.equal(v, full)
    v32 = sub(X.float())
    assert v32.dtype == torch.float32
    torch.testing.assert_close(v32, v.float(), rtol=0, atol=1e-4)
    # different configurations usually differ
    assert not torch.equal(v[:, 0], v[:, 1])


def test_n_jobs_identical(obj):
    gen = torch.Generator().manual_seed(1)
    X = torch.rand(4, 2, 2, generator=gen, dtype=f64)
    a = LandmineSVM(path=DATA, fields=[0, 7, 15, 28], n_jobs=1)(X)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # loky may warn about worker memory on small machines
        b = LandmineSVM(path=DATA, fields=[0, 7, 15, 28], n_jobs=2)(X)
    assert torch.equal(a, b)


def test_search_space_config():
    lin = LandmineSVM(
        path=DATA, fields=[0], search_space={"C": {"low": 1e-4, "high": 10}, "gamma": {"low": 0.01, "high": 10}}
    )
    X = torch.tensor([[[0.0, 0.5]]], dtype=f64)
    assert lin.native_configs(X) == [[{"C": 1e-4, "gamma": pytest.approx(5.005)}]]
    rev = LandmineSVM(
        path=DATA,
        fields=[0],
        search_space=SearchSpace.from_dict({"gamma": {"low": 0.1, "high": 1}, "C": {"low": 1, "high": 2}}),
    )
    assert rev.native_configs(torch.zeros(1, 1, 2, dtype=f64)) == [[{"gamma": 0.1, "C": 1.0}]]
    with pytest.raises(ValueError, match="exactly the parameters \\['C', 'gamma'\\]"):
        LandmineSVM(path=DATA, search_space={"C": {"low": 1e-4, "high": 10}})


def test_bad_inputs(obj):
    with pytest.raises(ValueError, match="field indices in \\[0, 29\\)"):
        LandmineSVM(path=DATA, fields=[0, 29])
    with pytest.raises(ValueError, match="field indices in \\[0, 29\\)"):
        LandmineSVM(path=DATA, fields=[-1])
    with pytest.raises(ValueError, match="must not repeat"):
        LandmineSVM(path=DATA, fields=[3, 3])
    with pytest.raises(TypeError, match="integer"):
        LandmineSVM(path=DATA, fields=[0.5])
    with pytest.raises(ValueError, match="n_jobs"):
        LandmineSVM(path=DATA, n_jobs=0)
    with pytest.raises(ValueError, match="outside the bounds"):
        obj(torch.full((29, 1, 2), 1.5, dtype=f64))
    with pytest.raises(ValueError, match="outside the bounds"):
        obj(torch.full((29, 1, 2), -0.1, dtype=f64))
    with pytest.raises(ValueError, match="k x q x d = 29 x q x 2"):
        obj(torch.rand(3, 1, 2, dtype=f64))
    with pytest.raises(ValueError, match="`agents` must lie in \\[0, 29\\)"):
        obj(torch.rand(1, 1, 2, dtype=f64), agents=torch.tensor([29]))
    with pytest.raises(ValueError, match="`agent` must lie"):
        obj.field_data(29)


def test_missing_file(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError) as e:
        LandmineSVM(path=tmp_path / "nope.mat")
    msg = str(e.value)
    assert LANDMINE_URL in msg and LANDMINE_ENV in msg and "nope.mat" in msg and "path=" in msg
    # a folder without the file
    with pytest.raises(FileNotFoundError, match="LandmineData.mat"):
        LandmineSVM(path=tmp_path)
    # the environment variable: a folder holding the file works, a wrong one is an error
    monkeypatch.setenv(LANDMINE_ENV, str(DATA.parent))
    assert resolve_landmine_path() == DATA
    monkeypatch.setenv(LANDMINE_ENV, str(tmp_path / "missing.mat"))
    with pytest.raises(FileNotFoundError, match=LANDMINE_ENV):
        resolve_landmine_path()
    # without either, the default places are searched (the repo's ../shared/data holds it)
    monkeypatch.delenv(LANDMINE_ENV)
    assert resolve_landmine_path().resolve() == DATA.resolve()
    # a file that is not the landmine .mat
    bad = tmp_path / "bad.mat"
    from scipy.io import savemat

    savemat(bad, {"x": np.zeros(3)})
    with pytest.raises(ValueError, match="feature"):
        LandmineSVM(path=bad)


def test_repeated_configurations_are_looked_up():
    obj = LandmineSVM(path=DATA, fields=[0, 1])
    X = torch.tensor([[[0.3, 0.6], [0.3, 0.6]], [[0.3, 0.6], [0.9, 0.1]]], dtype=torch.float64)
    first = obj(X)
    assert first[0, 0] == first[0, 1]
    assert len(obj._cache) == 3  # (0, x), (1, x), (1, x')
    obj._CACHE_SIZE = 3  # overflow clears the cache but keeps the answers right
    torch.testing.assert_close(obj(X.flip(1)), first.flip(1))
    fresh = LandmineSVM(path=DATA, fields=[0, 1])
    torch.testing.assert_close(fresh(X), first)


def test_platt_scoring_is_the_authors_predict_proba_auc():
    # the authors' SVC(probability=True).predict_proba AUC, computed by hand with scikit-learn
    import warnings

    from sklearn.metrics import roc_auc_score
    from sklearn.svm import SVC

    obj = LandmineSVM(fields=[0, 3], scoring="platt")
    X = torch.tensor([[[0.6, 0.4]], [[0.8, 0.7]]], dtype=torch.float64)
    got = obj(X)
    for i in range(2):
        Xtr, ytr, Xva, yva = obj.field_data(i)
        (cfg,) = obj.native_configs(X[i : i + 1])[0]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            clf = SVC(kernel="rbf", C=cfg["C"], gamma=cfg["gamma"], probability=True, random_state=0).fit(Xtr, ytr)
        assert got[i, 0].item() == roc_auc_score(yva, clf.predict_proba(Xva)[:, 1])
    with pytest.raises(ValueError, match="scoring"):
        LandmineSVM(fields=[0], scoring="brier")
