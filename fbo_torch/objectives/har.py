r"""Human activity recognition (UCI HAR): tune logistic regression per subject.

The FTS paper's "mobile phone sensors" experiment (Sec. 5.2, appendix D.2.2):
the UCI data set "Human Activity Recognition Using Smartphones" (Anguita et
al., 2013) has 561 features per time window, six activities and 30 subjects.
Agent ``n`` is a subject; it tunes a multinomial logistic regression (softmax
over the six classes) trained with minibatch SGD, over

* ``batch_size`` in ``[20, 60]`` (integer),
* ``l2`` in ``[1e-6, 1]`` (log scale),
* ``learning_rate`` in ``[0.01, 0.1]`` (log scale),

and reports the validation accuracy (the papers plot the validation error,
:meth:`HARLogReg.loss` ``= 1 - accuracy``).

Setup, per subject (the paper fixes the split and the model; the rest is ours
and documented here):

* The data set's own train/test partition is pooled; each subject's rows are
  split 50/50 into training and validation halves, stratified by activity
  (``train_test_split(..., test_size=0.5, stratify=y, random_state=split_seed)``).
* Inputs are standardized with the mean and standard deviation of the
  subject's training half (features with zero spread are left unscaled).
* The model ``softmax(x W + b)`` starts from ``W = 0, b = 0`` and is trained for
  ``epochs`` epochs (default **20**: 60–220 SGD steps for the 140–205 training
  rows per subject) of plain minibatch SGD, no momentum, minimizing
  ``mean cross-entropy + (l2 / 2) ‖W‖²`` (the bias is not penalized; the L2 term
  is the ``weight_decay`` of ``torch.optim.SGD``). Each epoch visits the
  training rows in a fresh random order in consecutive minibatches of
  ``batch_size`` rows; the last, smaller batch is kept (``drop_last=False``).
* The row orders are drawn once, when the objective is built, from a CPU
  generator seeded by ``(train_seed, subject id)``, and shared by every
  configuration of that subject (common random numbers). A configuration's
  accuracy is therefore a deterministic function of ``(subject, configuration)``;
  ``__call__`` and ``evaluate_true`` agree.

All ``(agent, configuration)`` pairs of a call are trained together as one
batch of independent models (batched matrix products; batches of different
sizes are padded and masked), in chunks of ``chunk_size`` pairs. Training runs
in the dual: SGD from ``W = 0`` keeps ``W = X_trainᵀ A`` in the span of the
training rows, so each step only needs the ``n_train x n_train`` Gram matrix
(``n_train ≈ 140–205 < 561``) and updates the coefficients ``A``; this is the
same SGD trajectory (tests compare it with ``torch.optim.SGD``) at a third of
the cost. A configuration's value does not depend on what it is batched with.

The data set is at
https://archive.ics.uci.edu/ml/datasets/Human+Activity+Recognition+Using+Smartphones
(``UCI HAR Dataset.zip``); pass the folder that holds ``train/`` and ``test/``
(or the folder containing ``UCI HAR Dataset/``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor

from fbo_torch.objectives.search_space import Integer, Real, SearchSpace, TuningObjective, as_search_space
from fbo_torch.utils.validation import check_int

HAR_URL = "https://archive.ics.uci.edu/ml/datasets/Human+Activity+Recognition+Using+Smartphones"
HAR_FOLDER = "UCI HAR Dataset"
PARAM_NAMES = ("batch_size", "l2", "learning_rate")


def default_har_search_space() -> SearchSpace:
    r"""The papers' LR space: batch size ``[20, 60]`` (integer), L2 ``[1e-6, 1]``
    and learning rate ``[0.01, 0.1]`` (both log scale)."""
    return SearchSpace(
        [
            Integer("batch_size", 20, 60),
            Real("l2", 1e-6, 1.0, log=True),
            Real("learning_rate", 0.01, 0.1, log=True),
        ]
    )


def _har_files(root: Path) -> dict[str, Path]:
    return {
        f"{kind}_{split}": root / split / f"{kind}_{split}.txt"
        for split in ("train", "test")
        for kind in ("X", "y", "subject")
    }


def resolve_har_root(path: str | os.PathLike[str]) -> Path:
    r"""The folder holding ``train/`` and ``test/`` of UCI HAR.

    ``path`` may be that folder or its parent containing ``UCI HAR Dataset/``
    (what unzipping the download gives).

    Raises:
        FileNotFoundError: Listing the missing files and where the data set comes from.
    """
    if path is None:
        raise TypeError(
            f"`path` is required: the folder of the UCI HAR data set (with train/ and test/), from {HAR_URL}."
        )
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"`path` must be a str or os.PathLike, got {type(path).__name__}.")
    root = Path(path).expanduser()
    if not all(p.is_file() for p in _har_files(root).values()) and (root / HAR_FOLDER).is_dir():
        root = root / HAR_FOLDER
    missing = [p for p in _har_files(root).values() if not p.is_file()]
    if missing:
        listed = "\n".join(f"  - {p}" for p in missing)
        raise FileNotFoundError(
            f"UCI HAR data set not found under {root}; missing:\n{listed}\n"
            f"Download 'Human Activity Recognition Using Smartphones' from {HAR_URL}, unzip it and "
            f"pass `path=` the '{HAR_FOLDER}' folder (layout: train/X_train.txt, train/y_train.txt, "
            "train/subject_train.txt and the same under test/ with _test)."
        )
    return root


def _read(path: Path, ndim: Literal[1, 2]) -> np.ndarray:
    try:
        a = np.loadtxt(path, dtype=np.float64, ndmin=ndim)
    except ValueError as e:
        raise ValueError(f"Could not parse {path} as whitespace-separated numbers: {e}") from e
    return a


def load_har(path: str | os.PathLike[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    r"""Read and pool the train and test parts of UCI HAR.

    Parsed files are cached (keyed by path, size and modification time), so
    building several objectives on the same data reads the text once.

    Returns:
        ``(X, y, subject)``: ``n x 561`` features, ``n`` activity labels (1..6)
        and ``n`` subject ids (1..30), train rows first (read-only arrays).
    """
    root = resolve_har_root(path)
    files = _har_files(root)
    key = tuple((str(p.absolute()), p.stat().st_size, p.stat().st_mtime_ns) for p in files.values())
    return _load_har_cached(key)


@lru_cache(maxsize=2)
def _load_har_cached(key: tuple[tuple[str, int, int], ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    files = {name: Path(k[0]) for name, k in zip(_har_files(Path(".")), key, strict=True)}
    root = files["X_train"].parent.parent
    Xs, ys, ss = [], [], []
    for split in ("train", "test"):
        X = _read(files[f"X_{split}"], 2)
        y = _read(files[f"y_{split}"], 1)
        s = _read(files[f"subject_{split}"], 1)
        if not (X.shape[0] == y.shape[0] == s.shape[0]):
            raise ValueError(
                f"UCI HAR {split} files disagree on the number of rows: X {X.shape[0]}, "
                f"y {y.shape[0]}, subject {s.shape[0]} (in {root / split})."
            )
        for name, v in (("y", y), ("subject", s)):
            if not np.all(v == np.round(v)):
                raise ValueError(f"{files[f'{name}_{split}']} must hold integers.")
        Xs.append(X)
        ys.append(y.astype(np.int64))
        ss.append(s.astype(np.int64))
    if Xs[0].shape[1] != Xs[1].shape[1]:
        raise ValueError(f"X_train has {Xs[0].shape[1]} features but X_test has {Xs[1].shape[1]}.")
    X = np.concatenate(Xs)
    if not np.isfinite(X).all():
        raise ValueError(f"UCI HAR features under {root} contain NaN/inf.")
    out = (X, np.concatenate(ys), np.concatenate(ss))
    for a in out:
        a.setflags(write=False)
    return out


def _half_split(y: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Stratified 50/50 split of row indices (classes with one row go to training)."""
    from sklearn.model_selection import train_test_split

    idx = np.arange(len(y))
    classes, counts = np.unique(y, return_counts=True)
    single = np.isin(y, classes[counts < 2])
    rest = idx[~single]
    if len(rest) < 2:
        raise ValueError("no activity has two or more rows, so no stratified split is possible")
    tr, va = train_test_split(rest, test_size=0.5, stratify=y[rest], random_state=seed)
    return np.sort(np.concatenate([tr, idx[single]])), np.sort(va)


class HARLogReg(TuningObjective):
    r"""Tune minibatch-SGD logistic regression per UCI HAR subject; value = validation accuracy.

    Agent ``n`` is subject ``subjects[n]`` (subject ids as in the files, 1..30;
    all subjects in increasing order by default). Inputs are unit-cube points
    ``[0, 1]^3`` mapped through ``search_space`` (``batch_size``, ``l2``,
    ``learning_rate``). See the module docstring for the split, the training
    procedure and the seeding.

    Args:
        path: The ``UCI HAR Dataset`` folder (with ``train/`` and ``test/``) or its
            parent.
        subjects: Subject ids that become the agents (unique, present in the data).
        split_seed: Seed of the per-subject stratified 50/50 split.
        epochs: Number of SGD epochs (default 20).
        search_space: A :class:`SearchSpace` (or dict form) over exactly
            ``batch_size`` (integer), ``l2`` and ``learning_rate``; default
            :func:`default_har_search_space`.
        device: Where the data lives and training runs (default CPU).
        train_seed: Seed of the per-epoch row orders.
        dtype: Floating dtype used for training (default float64).
        chunk_size: At most this many ``(agent, configuration)`` models are
            trained at once (bounds memory).

    Example:
        >>> obj = HARLogReg("~/data/UCI HAR Dataset")
        >>> X = torch.rand(obj.num_agents, 1, 3, dtype=torch.float64)
        >>> acc = obj(X)                       # 30 x 1 validation accuracies
        >>> obj.native_configs(X)[0][0]        # {'batch_size': 41, 'l2': ..., 'learning_rate': ...}
    """

    value_name = "accuracy"
    _loss_name = "validation error"

    def __init__(
        self,
        path: str | os.PathLike[str],
        subjects: Sequence[int] | Tensor | None = None,
        split_seed: int = 0,
        epochs: int = 20,
        search_space: SearchSpace | dict[str, Any] | None = None,
        device: torch.device | str | None = None,
        *,
        train_seed: int = 0,
        dtype: torch.dtype = torch.float64,
        chunk_size: int = 64,
    ) -> None:
        split_seed = check_int("split_seed", split_seed, minimum=0)
        self.epochs = check_int("epochs", epochs, minimum=1)
        self.train_seed = check_int("train_seed", train_seed, minimum=0)
        self.chunk_size = check_int("chunk_size", chunk_size, minimum=1)
        if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
            raise TypeError(f"`dtype` must be a floating torch.dtype, got {dtype}.")
        self.search_space = as_search_space(search_space, default_har_search_space(), PARAM_NAMES)
        if not self.search_space["batch_size"].is_integer or self.search_space["batch_size"].low < 1:
            raise ValueError(
                "`search_space`: `batch_size` must be an Integer parameter with low >= 1, "
                f"got {self.search_space['batch_size']!r}."
            )
        self._cols = [self.search_space.index(n) for n in PARAM_NAMES]
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.dtype = dtype
        self.split_seed = split_seed

        self.root = resolve_har_root(path)
        X, y, subj = load_har(self.root)
        self.classes: list[int] = np.unique(y).tolist()
        y = np.searchsorted(np.asarray(self.classes), y)
        all_subjects = np.unique(subj).tolist()
        if subjects is None:
            subjects = all_subjects
        else:
            # the items of an array (or of a list the caller built from one) are NumPy integers
            given: object = subjects.reshape(-1).tolist() if isinstance(subjects, (Tensor, np.ndarray)) else subjects
            if isinstance(given, (str, bytes)) or not isinstance(given, Sequence):
                raise TypeError(f"`subjects` must be a sequence of subject ids, got {type(given).__name__}.")
            subjects = [
                check_int(f"subjects[{i}]", int(s) if isinstance(s, np.integer) else s) for i, s in enumerate(given)
            ]
            if not subjects:
                raise ValueError("`subjects` must name at least one subject.")
            bad = [s for s in subjects if s not in all_subjects]
            if bad:
                raise ValueError(f"`subjects` {bad} are not in the data; available subject ids: {all_subjects}.")
            if len(set(subjects)) != len(subjects):
                raise ValueError(f"`subjects` must not repeat a subject, got {subjects}.")
        self.subjects: list[int] = list(subjects)
        self.num_agents = len(self.subjects)

        # per-agent standardized halves, padded into A x N x p blocks
        tr_parts, va_parts, ytr_parts, yva_parts = [], [], [], []
        for s in self.subjects:
            rows = np.flatnonzero(subj == s)
            if len(rows) < 4:
                raise ValueError(f"Subject {s} has only {len(rows)} rows; at least 4 are needed for a split.")
            try:
                tr, va = _half_split(y[rows], split_seed)
            except ValueError as e:
                raise ValueError(f"Subject {s}: cannot split its {len(rows)} rows 50/50: {e}") from e
            Xtr, Xva = X[rows[tr]], X[rows[va]]
            mu, sd = Xtr.mean(0), Xtr.std(0)
            sd = np.where(sd > 1e-12, sd, 1.0)
            tr_parts.append((Xtr - mu) / sd)
            va_parts.append((Xva - mu) / sd)
            ytr_parts.append(y[rows[tr]])
            yva_parts.append(y[rows[va]])
        self.train_sizes: list[int] = [len(a) for a in ytr_parts]
        self.val_sizes: list[int] = [len(a) for a in yva_parts]
        self.num_features = int(X.shape[1])
        self.num_classes = len(self.classes)
        self._parts = []
        for part in zip(tr_parts, ytr_parts, va_parts, yva_parts, strict=True):
            for arr in part:
                arr.setflags(write=False)
            self._parts.append(part)

        # Dual (kernel) representation: SGD from W = 0 keeps W = X_trᵀ A in the span of
        # the training rows, so we store Gram matrices instead of features (n_tr ≈ 140–205
        # is well below the 561 features) and train the n_tr x C coefficients A.
        A = self.num_agents
        N, M = max(self.train_sizes), max(self.val_sizes)
        gram = np.zeros((A, N, N))
        cross = np.zeros((A, M, N))
        ytr = np.zeros((A, N), dtype=np.int64)
        yva = np.zeros((A, M), dtype=np.int64)
        for a in range(A):
            nt, nv = self.train_sizes[a], self.val_sizes[a]
            gram[a, :nt, :nt] = tr_parts[a] @ tr_parts[a].T
            cross[a, :nv, :nt] = va_parts[a] @ tr_parts[a].T
            ytr[a, :nt] = ytr_parts[a]
            yva[a, :nv] = yva_parts[a]
        self._gram = torch.as_tensor(gram, device=self.device, dtype=dtype)  # A x N x N
        self._cross = torch.as_tensor(cross, device=self.device, dtype=dtype)  # A x M x N
        self._ytr = torch.as_tensor(ytr, device=self.device)
        self._yva = torch.as_tensor(yva, device=self.device)
        self._n_tr = torch.tensor(self.train_sizes, device=self.device)
        self._n_va = torch.tensor(self.val_sizes, device=self.device)

        # per-epoch row orders: A x epochs x N_max (padded with 0), CPU-seeded
        perms = torch.zeros(A, self.epochs, N, dtype=torch.long)
        for a, s in enumerate(self.subjects):
            gen = torch.Generator().manual_seed(self.train_seed * 1_000_003 + int(s))
            for epoch in range(self.epochs):
                perms[a, epoch, : self.train_sizes[a]] = torch.randperm(self.train_sizes[a], generator=gen)
        self._perms = perms.to(self.device)

    # -------------------------------------------------------------- metadata
    @property
    def subject_sizes(self) -> list[int]:
        """Number of rows per agent's subject (train + validation halves)."""
        return [a + b for a, b in zip(self.train_sizes, self.val_sizes, strict=True)]

    def subject_data(self, agent: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        r"""``(X_train, y_train, X_val, y_val)`` of agent ``agent``: standardized
        features (training-half statistics) and 0-based labels (read-only arrays)."""
        agent = check_int("agent", agent)
        if not 0 <= agent < self.num_agents:
            raise ValueError(f"`agent` must lie in [0, {self.num_agents}), got {agent}.")
        return self._parts[agent]

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(root={str(self.root)!r}, num_agents={self.num_agents}, "
            f"epochs={self.epochs}, split_seed={self.split_seed}, train_seed={self.train_seed}, "
            f"device={self.device}, dtype={self.dtype}, search_space={self.search_space!r})"
        )

    # ------------------------------------------------------------ evaluation
    def _evaluate(self, X: Tensor, agents: Tensor, noise: bool) -> Tensor:
        k, q, _ = X.shape
        V = self.search_space.to_native(X.detach().to(device="cpu", dtype=torch.float64)).reshape(k * q, -1)
        ag = agents.to("cpu").repeat_interleave(q)
        bs = V[:, self._cols[0]].round().long()
        l2 = V[:, self._cols[1]]
        lr = V[:, self._cols[2]]
        out = torch.empty(k * q, dtype=torch.float64)
        for start in range(0, k * q, self.chunk_size):
            sl = slice(start, start + self.chunk_size)
            out[sl] = self.train_and_score(ag[sl], bs[sl], l2[sl], lr[sl]).to(device="cpu", dtype=torch.float64)
        return out.reshape(k, q).to(device=X.device, dtype=X.dtype)

    def train_and_score(self, agents: Tensor, batch_size: Tensor, l2: Tensor, learning_rate: Tensor) -> Tensor:
        r"""Train ``K`` independent models with native hyperparameters; return validation accuracies.

        Args:
            agents: ``K`` agent indices (long).
            batch_size: ``K`` batch sizes (long, ``>= 1``).
            l2: ``K`` L2 penalties (``>= 0``).
            learning_rate: ``K`` learning rates (``> 0``).

        Returns:
            ``K`` validation accuracies on ``self.device`` (float64).
        """
        dev, dt = self.device, self.dtype
        agents = torch.as_tensor(agents, device=dev).long().reshape(-1)
        B = torch.as_tensor(batch_size, device=dev).long().reshape(-1)
        l2 = torch.as_tensor(l2, device=dev, dtype=dt).reshape(-1, 1, 1)
        lr = torch.as_tensor(learning_rate, device=dev, dtype=dt).reshape(-1, 1, 1)
        K = agents.numel()
        if not (B.numel() == l2.numel() == lr.numel() == K):
            raise ValueError("`agents`, `batch_size`, `l2` and `learning_rate` must have the same length.")
        if K == 0:
            return torch.empty(0, dtype=torch.float64, device=dev)
        if (B < 1).any() or (l2 < 0).any() or (lr <= 0).any():
            raise ValueError("Need batch_size >= 1, l2 >= 0 and learning_rate > 0.")
        C = self.num_classes

        n = self._n_tr[agents]  # K
        perms = self._perms[agents]  # K x E x N
        gram = self._gram[agents]  # K x N x N
        ytr = self._ytr[agents]  # K x N
        N = perms.shape[-1]
        Bmax = int(B.max())
        steps = int(((n + B - 1) // B).max())
        col = torch.arange(Bmax, device=dev)
        eye = torch.eye(C, device=dev, dtype=dt)
        rows_k = torch.arange(K, device=dev).unsqueeze(-1)
        decay = 1.0 - lr * l2  # K x 1 x 1

        # W = X_trᵀ Acoef (p x C per model), b the bias; both start at zero
        Acoef = torch.zeros(K, N, C, device=dev, dtype=dt)
        b = torch.zeros(K, 1, C, device=dev, dtype=dt)
        for e in range(self.epochs):
            perm_e = perms[:, e, :]  # K x N
            for s in range(steps):
                pos = s * B.unsqueeze(-1) + col  # K x Bmax
                mask = (col < B.unsqueeze(-1)) & (pos < n.unsqueeze(-1))
                cnt = mask.sum(-1)
                local = perm_e[rows_k, pos.clamp(max=N - 1)]  # K x Bmax rows of the batch
                Kb = gram[rows_k, local]  # K x Bmax x N: x_i · x_j for batch rows i
                P = torch.softmax(torch.baddbmm(b, Kb, Acoef), dim=-1)
                m = mask.to(dt).unsqueeze(-1) / cnt.clamp(min=1).to(dt).reshape(-1, 1, 1)
                G = (P - eye[ytr[rows_k, local]]) * m  # K x Bmax x C: mean-CE gradient rows
                step = torch.zeros_like(Acoef).scatter_add_(1, local.unsqueeze(-1).expand(-1, -1, C), G)
                active = (cnt > 0).reshape(-1, 1, 1)
                # W <- W - lr (X_bᵀ G + l2 W)  <=>  A <- (1 - lr l2) A - lr S_b G
                Acoef = torch.where(active, decay * Acoef - lr * step, Acoef)
                b = torch.where(active, b - lr * G.sum(-2, keepdim=True), b)

        pred = torch.baddbmm(b, self._cross[agents], Acoef).argmax(-1)  # K x M
        M = pred.shape[-1]
        vmask = torch.arange(M, device=dev) < self._n_va[agents].unsqueeze(-1)
        correct = ((pred == self._yva[agents]) & vmask).sum(-1)
        return correct.to(torch.float64) / self._n_va[agents].to(torch.float64)
