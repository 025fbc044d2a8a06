r"""Landmine detection: tune an RBF SVM per landmine field (FTS, DP-FTS-DE).

The data set (Xue et al., 2007; used in FTS Sec. 5.2 / appendix D.2.2 and in
DP-FTS-DE) holds 29 landmine fields; every location has 9 radar-image features
and a binary label (2.9–9.4 % positives per field, 445–690 locations). Agent
``n`` is field ``n``: it tunes the RBF-kernel SVM hyperparameters ``C`` (L2
regularization, ``[1e-4, 10]``) and ``γ`` (kernel parameter, ``[1e-2, 10]``) and
scores a configuration by the validation AUC.

Setup, per field:

* A stratified 50/50 train/validation split,
  ``train_test_split(X, y, test_size=0.5, stratify=y, random_state=split_seed)``.
  With ``split_seed=0`` this is exactly the split of the authors' preprocessing
  script, so the functions match theirs.
* ``sklearn.svm.SVC(kernel="rbf", C=C, gamma=γ)`` fit on the training half.
* Value = ``roc_auc_score`` of the validation labels against
  ``decision_function``. The authors used ``SVC(probability=True)`` and
  ``predict_proba``; Platt scaling is monotone, so the AUC is the same up to the
  internal cross-validation noise of Platt scaling — ``decision_function`` is
  deterministic, several times cheaper (no internal cross-validation; see
  docs/design.md), and ``probability=True`` is deprecated in scikit-learn 1.9.
* **No feature standardization by default.** The features in ``LandmineData.mat``
  already come on a common, roughly zero-mean unit-variance scale (per-field
  means within ±0.4, standard deviations 0.1–1.8), the papers' ``γ`` range was
  chosen for that scale, and the authors' code fed the raw features to the SVM.
  Per-field standardization (fit on the training half only) is available with
  ``standardize=True``; on a log grid it changes the best AUC per field by
  ±0.05 and the mean best AUC over the 29 fields from 0.799 to 0.795.
* **Search space: log scale by default** (deviation from the authors' code,
  which mapped ``[0, 1]`` linearly onto ``[1e-4, 10]``, so that 99.9 % of the
  ``C`` axis lies above 0.01). Pass ``search_space=SearchSpace([Real("C", 1e-4,
  10), Real("gamma", 1e-2, 10)])`` to reproduce the linear mapping.

The objective is deterministic: ``__call__`` and ``evaluate_true`` agree.
Typical AUCs with ``split_seed=0``: the best AUC per field on a log grid ranges
from 0.63 to 0.91 (mean 0.80; fields 0–5: mean 0.85); poor settings give AUCs
between 0.26 and 0.6, so some fields have values below 0.5.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fbo_torch.objectives.search_space import Real, SearchSpace, TuningObjective, as_search_space
from fbo_torch.utils.paths import checkout_root, user_data_dir
from fbo_torch.utils.validation import check_int

#: Where the data set comes from (as cited in the FTS paper, appendix D.2.2).
LANDMINE_URL = "http://www.ee.duke.edu/~lcarin/LandmineData.zip"
#: Environment variable that points to ``LandmineData.mat`` (or its folder).
LANDMINE_ENV = "FBO_LANDMINE_PATH"
LANDMINE_FILENAME = "LandmineData.mat"
NUM_FIELDS = 29


def default_landmine_search_space() -> SearchSpace:
    r"""``C ∈ [1e-4, 10]`` and ``γ ∈ [1e-2, 10]``, both on a log scale."""
    return SearchSpace([Real("C", 1e-4, 10.0, log=True), Real("gamma", 1e-2, 10.0, log=True)])


def _candidates() -> list[Path]:
    cwd = Path.cwd()
    out = [user_data_dir() / LANDMINE_FILENAME]
    root = checkout_root()
    if root is not None:  # a source checkout: its data folder and the shared one beside it
        out += [root.parent / "shared" / "data" / LANDMINE_FILENAME, root / "data" / LANDMINE_FILENAME]
    out += [cwd / LANDMINE_FILENAME, cwd / "data" / LANDMINE_FILENAME]
    out += [cwd.parent / "shared" / "data" / LANDMINE_FILENAME]
    seen: list[Path] = []
    for p in out:
        if p not in seen:
            seen.append(p)
    return seen


def _not_found(looked: Sequence[Path], why: str) -> FileNotFoundError:
    where = "\n".join(f"  - {p}" for p in looked)
    return FileNotFoundError(
        f"{LANDMINE_FILENAME} not found ({why}). Looked in:\n{where}\n"
        f"It is the landmine detection data set of the FTS paper (Xue et al., 2007): download "
        f"{LANDMINE_URL}, unzip it, and put {LANDMINE_FILENAME} in {user_data_dir()}, pass `path=` (the .mat "
        f"file or its folder) or set the environment variable {LANDMINE_ENV}."
    )


def resolve_landmine_path(path: str | os.PathLike[str] | None = None) -> Path:
    r"""Find ``LandmineData.mat``.

    Order: the ``path`` argument (a file, or a folder holding the file), else the
    environment variable ``FBO_LANDMINE_PATH`` (same), else the defaults: the user
    data folder (:func:`~fbo_torch.utils.paths.user_data_dir`: ``$FBO_DATA_DIR``,
    else ``~/.local/share/fbo_torch``), in a source checkout ``<repo>/../shared/data``
    and ``<repo>/data``, then ``<cwd>``, ``<cwd>/data`` and ``<cwd>/../shared/data``
    (never a folder of the installed package). An explicit ``path`` or environment variable that
    does not lead to the file is an error (no silent fallback).

    Raises:
        FileNotFoundError: Naming the places searched and where the file comes from.
    """

    def expand(p: Path) -> Path:
        p = p.expanduser()
        return p / LANDMINE_FILENAME if p.is_dir() else p

    if path is not None:
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"`path` must be a str or os.PathLike, got {type(path).__name__}.")
        p = expand(Path(path))
        if not p.is_file():
            raise _not_found([p], "given as `path`")
        return p
    env = os.environ.get(LANDMINE_ENV)
    if env:
        p = expand(Path(env))
        if not p.is_file():
            raise _not_found([p], f"given by ${LANDMINE_ENV}")
        return p
    cands = _candidates()
    for p in cands:
        if p.is_file():
            return p
    raise _not_found(cands, f"no `path` given and ${LANDMINE_ENV} unset")


@lru_cache(maxsize=4)
def _load_mat(path: str, mtime_ns: int, size: int) -> tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...]]:
    # keyed on (path, mtime, size): constructing many objectives reads the file once
    from scipy.io import loadmat

    try:
        mat = loadmat(path)
    except Exception as e:
        raise ValueError(f"Could not read {path} as a MATLAB file: {e}") from e
    if "feature" not in mat or "label" not in mat:
        raise ValueError(
            f"{path} lacks the `feature`/`label` cell arrays of LandmineData.mat (keys: "
            f"{sorted(k for k in mat if not k.startswith('__'))})."
        )
    feats, labels = [], []
    for i, (f, y) in enumerate(zip(mat["feature"].reshape(-1), mat["label"].reshape(-1), strict=True)):
        f = np.ascontiguousarray(np.asarray(f, dtype=np.float64))
        y = np.asarray(y).reshape(-1).astype(np.int64)
        if f.ndim != 2 or f.shape[0] != y.shape[0]:
            raise ValueError(f"{path}: field {i} has features {f.shape} and labels {y.shape}.")
        if not np.isfinite(f).all():
            raise ValueError(f"{path}: field {i} has non-finite features.")
        f.setflags(write=False)
        y.setflags(write=False)
        feats.append(f)
        labels.append(y)
    return tuple(feats), tuple(labels)


def _make_worker() -> Callable[..., float]:
    # Defined in a closure on purpose: joblib's loky backend pickles such a
    # function *by value* (cloudpickle), so worker processes only import numpy
    # and scikit-learn. A module-level function is pickled by reference and
    # every worker would import fbo_torch (torch, gpytorch, botorch) first,
    # which doubles the start-up time of the process pool.
    def _svm_auc(
        X_train: np.ndarray,
        y_train: np.ndarray,
        X_val: np.ndarray,
        y_val: np.ndarray,
        C: float,
        gamma: float,
        scoring: str = "decision",
    ) -> float:
        """Fit an RBF SVC on the training half, return the validation AUC."""
        import warnings

        from sklearn import config_context
        from sklearn.metrics import roc_auc_score
        from sklearn.svm import SVC

        # The features were checked once when the data were loaded (finite float64) and
        # C, γ come from the search space; skipping scikit-learn's per-call validation
        # changes no result and saves ~15% of an evaluation.
        with config_context(assume_finite=True, skip_parameter_validation=True):
            if scoring == "platt":  # the authors' SVC(probability=True).predict_proba (libsvm's internal 5-fold CV)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    clf = SVC(kernel="rbf", C=C, gamma=gamma, probability=True, random_state=0)
                    clf.fit(X_train, y_train)
                    return float(roc_auc_score(y_val, clf.predict_proba(X_val)[:, 1]))
            clf = SVC(kernel="rbf", C=C, gamma=gamma)
            clf.fit(X_train, y_train)
            return float(roc_auc_score(y_val, clf.decision_function(X_val)))

    return _svm_auc


_svm_auc = _make_worker()


class LandmineSVM(TuningObjective):
    r"""Tune an RBF SVM (``C``, ``γ``) on each landmine field; value = validation AUC.

    Agent ``n`` is landmine field ``fields[n]`` (0-based index into the 29 fields
    of ``LandmineData.mat``, in file order; all 29 by default). Inputs are
    unit-cube points ``[0, 1]^2`` mapped through ``search_space``; see the
    module docstring for the split, the (absent) standardization and the
    deviations from the authors' code.

    Args:
        path: ``LandmineData.mat`` or its folder; default: ``$FBO_LANDMINE_PATH``,
            then a few standard places (see :func:`resolve_landmine_path`).
        fields: Field indices in ``[0, 29)`` that become the agents (unique).
        split_seed: Seed of the stratified 50/50 split (``random_state`` of
            ``train_test_split``; 0 reproduces the authors' split).
        n_jobs: Processes used to fit a batch of SVMs (joblib; ``-1`` = all
            cores). Results do not depend on it.
        search_space: A :class:`SearchSpace` (or its dict form) over exactly
            ``C`` and ``gamma``; default :func:`default_landmine_search_space`.
        standardize: Standardize each field's features with the statistics of its
            training half (default ``False``, see the module docstring).
        scoring: ``"decision"`` (AUC of ``decision_function``, default) or
            ``"platt"`` (AUC of Platt-scaled ``predict_proba``, as the authors:
            the same ranking up to ties where probabilities saturate; several times slower).

    Example:
        >>> obj = LandmineSVM(fields=[0, 1, 2])
        >>> X = torch.rand(3, 4, 2, dtype=torch.float64)   # k x q x d
        >>> auc = obj(X)                                    # 3 x 4 AUCs
        >>> obj.native_configs(X)[0][0]                     # {'C': ..., 'gamma': ...}
    """

    value_name = "AUC"
    _loss_name = "1 - AUC"

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        fields: Sequence[int] | Tensor | None = None,
        split_seed: int = 0,
        n_jobs: int = 1,
        search_space: SearchSpace | dict[str, Any] | None = None,
        standardize: bool = False,
        scoring: str = "decision",
    ) -> None:
        from sklearn.model_selection import train_test_split

        split_seed = check_int("split_seed", split_seed, minimum=0)
        n_jobs = check_int("n_jobs", n_jobs)
        if n_jobs == 0:
            raise ValueError("`n_jobs` must be a positive number of processes or negative (joblib style), got 0.")
        if not isinstance(standardize, bool):
            raise TypeError(f"`standardize` must be a bool, got {type(standardize).__name__}.")
        if scoring not in ("decision", "platt"):
            raise ValueError(f"`scoring` must be 'decision' or 'platt', got {scoring!r}.")
        self.scoring = scoring
        self.search_space = as_search_space(search_space, default_landmine_search_space(), ("C", "gamma"))
        self._iC = self.search_space.index("C")
        self._ig = self.search_space.index("gamma")

        self.path = resolve_landmine_path(path)
        st = self.path.stat()
        feats, labels = _load_mat(str(self.path.resolve()), st.st_mtime_ns, st.st_size)
        self.num_fields_in_file = len(feats)

        if fields is None:
            fields = list(range(len(feats)))
        else:
            # the items of an array (or of a list the caller built from one) are NumPy integers
            given: object = fields.reshape(-1).tolist() if isinstance(fields, (Tensor, np.ndarray)) else fields
            if isinstance(given, (str, bytes)) or not isinstance(given, Sequence):
                raise TypeError(f"`fields` must be a sequence of field indices, got {type(given).__name__}.")
            fields = [
                check_int(f"fields[{i}]", int(f) if isinstance(f, np.integer) else f) for i, f in enumerate(given)
            ]
            if not fields:
                raise ValueError("`fields` must name at least one field.")
            bad = [f for f in fields if not 0 <= f < len(feats)]
            if bad:
                raise ValueError(
                    f"`fields` must hold field indices in [0, {len(feats)}) (0-based, file order), got {bad}."
                )
            if len(set(fields)) != len(fields):
                raise ValueError(f"`fields` must not repeat a field, got {fields}.")
        self.fields: list[int] = list(fields)
        self.num_agents = len(self.fields)
        self.split_seed = split_seed
        self.n_jobs = n_jobs
        self.standardize = standardize

        self._data: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        for f in self.fields:
            X, y = feats[f], labels[f]
            if len(np.unique(y)) != 2:
                raise ValueError(f"{self.path}: field {f} needs both classes, has labels {np.unique(y).tolist()}.")
            Xtr, Xva, ytr, yva = train_test_split(X, y, test_size=0.5, stratify=y, random_state=split_seed)
            if standardize:
                mu = Xtr.mean(0)
                sd = Xtr.std(0)
                sd = np.where(sd > 0, sd, 1.0)
                Xtr, Xva = (Xtr - mu) / sd, (Xva - mu) / sd
            Xtr, ytr, Xva, yva = (np.ascontiguousarray(a) for a in (Xtr, ytr, Xva, yva))
            self._data.append((Xtr, ytr, Xva, yva))
        self._cache: dict[tuple[int, float, float], float] = {}

    # -------------------------------------------------------------- metadata
    @property
    def field_sizes(self) -> list[int]:
        """Number of locations of each agent's field (train + validation)."""
        return [len(d[1]) + len(d[3]) for d in self._data]

    @property
    def train_sizes(self) -> list[int]:
        return [len(d[1]) for d in self._data]

    @property
    def val_sizes(self) -> list[int]:
        return [len(d[3]) for d in self._data]

    @property
    def positive_rates(self) -> list[float]:
        """Fraction of locations with landmines, per agent's field."""
        return [float((np.sum(d[1]) + np.sum(d[3])) / (len(d[1]) + len(d[3]))) for d in self._data]

    @property
    def num_features(self) -> int:
        return int(self._data[0][0].shape[1])

    def field_data(self, agent: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``(X_train, y_train, X_val, y_val)`` of agent ``agent`` (read-only arrays)."""
        agent = check_int("agent", agent)
        if not 0 <= agent < self.num_agents:
            raise ValueError(f"`agent` must lie in [0, {self.num_agents}), got {agent}.")
        return self._data[agent]

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(path={str(self.path)!r}, num_agents={self.num_agents}, "
            f"split_seed={self.split_seed}, n_jobs={self.n_jobs}, standardize={self.standardize}, "
            f"scoring={self.scoring!r}, "
            f"search_space={self.search_space!r})"
        )

    # ------------------------------------------------------------ evaluation
    _CACHE_SIZE = 200_000

    def _evaluate(self, X: Tensor, agents: Tensor, noise: bool) -> Tensor:
        k, q, _ = X.shape
        V = self.search_space.to_native(X.detach().to(device="cpu", dtype=torch.float64))
        ag = agents.tolist()
        # a configuration's AUC is deterministic: repeated (agent, C, gamma) queries — e.g.
        # every agent of a DP-FTS-DE round that follows the same broadcast — are looked up
        keys = [(ag[i], float(V[i, j, self._iC]), float(V[i, j, self._ig])) for i in range(k) for j in range(q)]
        todo = list(dict.fromkeys(key for key in keys if key not in self._cache))
        tasks = [(*self._data[a], C, g, self.scoring) for a, C, g in todo]
        if self.n_jobs == 1 or len(tasks) <= 1:
            out = [_svm_auc(*t) for t in tasks]
        else:
            from joblib import Parallel, delayed

            out = Parallel(n_jobs=self.n_jobs)(delayed(_svm_auc)(*t) for t in tasks)
        found = {key: self._cache[key] for key in keys if key in self._cache}
        found.update(zip(todo, out, strict=True))
        if len(self._cache) + len(todo) > self._CACHE_SIZE:
            self._cache.clear()
        self._cache.update(zip(todo, out, strict=True))
        vals = [found[key] for key in keys]
        return torch.tensor(vals, dtype=torch.float64).reshape(k, q).to(device=X.device, dtype=X.dtype)
