r"""Where fbo_torch finds what it does not hold in its code: the user's data folder and the shipped examples.

* :func:`user_data_dir` — where data sets the objectives read from disk are looked for when no path is
  given (landmine's ``LandmineData.mat``, EMNIST): ``$FBO_DATA_DIR``, else ``$XDG_DATA_HOME/fbo_torch``,
  else ``~/.local/share/fbo_torch``; never a folder of the installed package.
* :func:`shipped_examples` — the example configs (``configs/``) and programs (``examples/``: your own
  objective, Ax, the Flower app and its demo): in an installed wheel they are package data
  (``fbo_torch/_examples/``, copied there when the wheel is built); in a source checkout, the
  checkout's own folders. ``fbo-torch examples DIR`` copies them (:func:`copy_examples`).

Nothing here imports torch.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

#: Environment variable naming the user's data folder (:func:`user_data_dir`).
DATA_DIR_ENV = "FBO_DATA_DIR"
#: The shipped folders, by the name they have in the repository and in a copy.
EXAMPLE_FOLDERS = ("configs", "examples")
_PACKAGE = Path(__file__).resolve().parents[1]


def user_data_dir() -> Path:
    r"""The user's data folder: ``$FBO_DATA_DIR``, else ``$XDG_DATA_HOME/fbo_torch``, else
    ``~/.local/share/fbo_torch`` (it need not exist)."""
    given = os.environ.get(DATA_DIR_ENV)
    if given:
        return Path(given).expanduser()
    xdg = os.environ.get("XDG_DATA_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".local" / "share"
    return base / "fbo_torch"


def checkout_root() -> Path | None:
    r"""The repository this copy of fbo_torch runs from (a source checkout or an editable install), or
    ``None`` for an installed package."""
    root = _PACKAGE.parent
    pyproject = root / "pyproject.toml"
    try:
        if 'name = "fbo_torch"' in pyproject.read_text():
            return root
    except OSError:
        pass
    return None


def shipped_examples() -> Path | None:
    r"""The folder holding the shipped ``configs/`` and ``examples/``: the package's ``_examples`` (a wheel),
    else the source checkout (``None`` if neither has them)."""
    packaged = _PACKAGE / "_examples"
    if all((packaged / name).is_dir() for name in EXAMPLE_FOLDERS):
        return packaged
    root = checkout_root()
    if root is not None and all((root / name).is_dir() for name in EXAMPLE_FOLDERS):
        return root
    return None


def example_files() -> list[str]:
    r"""The shipped example files, as paths relative to :func:`shipped_examples` (``configs/x.yaml``, ...)."""
    root = shipped_examples()
    if root is None:
        return []
    out = []
    for name in EXAMPLE_FOLDERS:
        for path in sorted((root / name).rglob("*")):
            rel = path.relative_to(root)
            if path.is_file() and "__pycache__" not in rel.parts and not path.name.startswith("."):
                out.append(rel.as_posix())
    return out


def shipped_example(path: str | os.PathLike[str]) -> str | None:
    r"""The shipped example a missing ``path`` names (``configs/fts_synthetic.yaml``, or only its file name), as
    a path relative to :func:`shipped_examples`; ``None`` if it names none."""
    text = Path(path).as_posix()
    files = example_files()
    by_name = [f for f in files if f.rsplit("/", 1)[-1] == Path(path).name]
    exact = [f for f in files if text == f or text.endswith("/" + f)]
    found = exact or by_name
    return found[0] if len(found) == 1 or exact else None


def copy_examples(dest: str | os.PathLike[str]) -> list[Path]:
    r"""Copy the shipped ``configs/`` and ``examples/`` into ``dest`` (created); returns the files written.

    Nothing is overwritten: a file of the same name already in ``dest`` raises ``FileExistsError`` (naming
    it) before anything is copied. Shell scripts are made executable.

    Raises:
        FileNotFoundError: This installation holds no examples.
        FileExistsError: ``dest`` already holds one of the files.
    """
    root = shipped_examples()
    if root is None:
        raise FileNotFoundError("this installation of fbo_torch holds no example files (fbo_torch/_examples)")
    dest = Path(dest).expanduser()
    files = example_files()
    taken = [f for f in files if os.path.lexists(dest / f)]
    if taken:
        more = f" (and {len(taken) - 1} more)" if len(taken) > 1 else ""
        raise FileExistsError(f"{dest / taken[0]} exists{more}; nothing was copied: choose an empty or new folder")
    written = []
    for rel in files:
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(root / rel, target)
        if target.suffix == ".sh":
            target.chmod(target.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        written.append(target)
    return written
