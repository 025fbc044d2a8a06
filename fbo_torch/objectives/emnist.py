r"""EMNIST's "digits" split on disk: download, load, scale.

Read through torchvision (:func:`~fbo_torch.utils.torchvision_compat.import_torchvision`,
imported only when a function here runs), in torchvision's layout
``root/EMNIST/raw``. :class:`~fbo_torch.objectives.vision.EMNISTCNN` is the
objective built on it; ``fbo-torch data emnist --root DIR`` runs
:func:`download_emnist`.
"""

from __future__ import annotations

import os

import torch
from torch import Tensor

from fbo_torch.utils.paths import user_data_dir

__all__ = ["EMNIST_ROOT_ENV", "download_emnist", "emnist_to_float", "load_emnist_digits"]

#: Environment variable naming the folder that holds ``EMNIST/raw`` (used when ``root`` is not given).
EMNIST_ROOT_ENV = "FBO_EMNIST_ROOT"

_EMNIST_HOW_TO = (
    "Download it with `fbo-torch data emnist` (NIST's gzip.zip, about 540 MB, through torchvision, into the "
    "user data folder, where it is found without settings; `--root <folder>` elsewhere, then set "
    "FBO_EMNIST_ROOT=<folder> or pass root=<folder>); on a machine without internet access, run that command "
    "on one with it and copy <folder>/EMNIST/raw/emnist-digits-* to <folder>/EMNIST/raw/ here."
)
_EMNIST_HELP = (
    "EMNIST 'digits' was not found under {root!r} (torchvision reads "
    "{root}/EMNIST/raw/emnist-digits-{{train,test}}-{{images-idx3,labels-idx1}}-ubyte). "
) + _EMNIST_HOW_TO


def load_emnist_digits(
    root: str | os.PathLike[str] | None = None, train: bool = True, download: bool = False
) -> tuple[Tensor, Tensor, str]:
    r"""EMNIST's "digits" split as read by ``torchvision.datasets.EMNIST``, with a clear error when it is missing.

    Args:
        root: Folder holding ``EMNIST/raw/emnist-digits-*-ubyte``; default: the
            environment variable ``FBO_EMNIST_ROOT``, else the user data folder
            (:func:`~fbo_torch.utils.paths.user_data_dir`, where ``fbo-torch data emnist`` downloads it).
        train: EMNIST's training file (``True``) or its test file.
        download: Let torchvision download EMNIST (needs internet access).

    Returns:
        ``images``: ``m x 28 x 28`` uint8 as stored (transposed; :func:`emnist_to_float`
        makes them upright), ``labels``: ``m`` long, and the folder read.

    Raises:
        FileNotFoundError: If the EMNIST files are missing (the message says how
            to fetch them).
        ImportError: If torchvision is not installed.
    """
    from fbo_torch.utils.torchvision_compat import import_torchvision

    tv = import_torchvision()
    if root is None:
        root = os.environ.get(EMNIST_ROOT_ENV) or user_data_dir()
    root = os.fspath(root)
    try:
        ds = tv.datasets.EMNIST(root, split="digits", train=bool(train), download=bool(download))
    except RuntimeError as err:
        if "not found" in str(err).lower():
            raise FileNotFoundError(_EMNIST_HELP.format(root=root)) from err
        raise
    images, labels = ds.data, ds.targets.long()
    if images.ndim != 3 or images.shape[0] != labels.shape[0]:
        raise ValueError(f"Unexpected EMNIST arrays: images {tuple(images.shape)}, labels {tuple(labels.shape)}.")
    return images, labels, root


def download_emnist(root: str | os.PathLike[str], url: str | None = None) -> tuple[int, int]:
    r"""Download EMNIST into ``root/EMNIST/raw`` (torchvision's layout) and check its "digits" split.

    Goes through :func:`~fbo_torch.utils.torchvision_compat.import_torchvision`, so it works
    where a plain ``import torchvision`` fails (a CUDA torchvision beside a CPU torch). The
    archive's MD5 is checked (torchvision's); files already there are not fetched again.

    Args:
        root: The folder (``FBO_EMNIST_ROOT`` /
            :class:`~fbo_torch.objectives.vision.EMNISTCNN`'s ``root``).
        url: A mirror of NIST's ``gzip.zip`` (default: torchvision's URL).

    Returns:
        The numbers of training and test images of the "digits" split.
    """
    from fbo_torch.utils.torchvision_compat import import_torchvision

    emnist = import_torchvision().datasets.EMNIST
    if url is not None:
        emnist = type("EMNIST", (emnist,), {"url": str(url)})  # same files, same layout, another address
    root = os.fspath(root)
    train = emnist(root, split="digits", train=True, download=True)
    test = emnist(root, split="digits", train=False, download=False)
    return len(train), len(test)


def emnist_to_float(data: Tensor) -> Tensor:
    """``m x 28 x 28`` uint8 EMNIST images -> upright ``m x 1 x 28 x 28`` float32 in ``[0, 1]``."""
    return data.transpose(-1, -2).unsqueeze(1).to(torch.float32) / 255.0
