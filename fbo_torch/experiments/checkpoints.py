r"""Checkpoints of an experiment run in ``OUT/checkpoints``, one file per (scenario, method).

A checkpoint holds either a finished method's JSON ``record`` or an unfinished
runner's ``state_dict`` (``runner``), stamped with the checkpoint format version
and the run's configuration fingerprint
(:func:`~fbo_torch.experiments.outdir.fingerprint`).

A checkpoint is data, never code: it is read with ``torch.load(weights_only=True)``,
whose unpickler rebuilds only tensors and plain containers (dicts, lists, tuples,
strings, numbers) and refuses anything else before it is constructed, so a file
planted in ``--out/checkpoints`` (``--out`` may be shared, restored or
downloaded) cannot run code when a run is resumed; it is named as unreadable.
:meth:`Checkpoints.save` reads back what it wrote the same way, so a state that
would not load is refused when it is written, not at the resume.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

import torch

from fbo_torch.experiments.outdir import ResumeError, atomic_write_bytes

CHECKPOINT_VERSION = 2


class Checkpoints:
    r"""The checkpoints of one run in ``OUT/checkpoints``, each stamped with the run's fingerprint.

    ``load`` (only when resuming) refuses a checkpoint of another configuration
    or package version and names an unreadable (truncated, corrupt) one; ``save``
    writes atomically (temporary file, fsync, ``os.replace``), so a run killed
    mid-write leaves the previous checkpoint intact.
    """

    def __init__(self, folder: Path, fingerprint: str, resume: bool) -> None:
        self.folder = Path(folder)
        self.fingerprint = fingerprint
        self.resume = resume
        self._verified: dict[Path, dict[str, Any]] = {}  # read by verify_all, handed out once by load

    def path(self, si: int, mi: int) -> Path:
        return self.folder / f"scenario{si}_method{mi}.pt"

    def load(self, path: Path) -> dict[str, Any] | None:
        if path in self._verified:
            return self._verified.pop(path)
        if not self.resume or not path.exists():
            return None
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as err:  # truncated zip, bad pickle, ...: torch raises many kinds
            text = str(err).strip()
            reason = text.splitlines()[0].split(". ")[0][:160] if text else type(err).__name__
            raise ResumeError(
                f"checkpoint {path} is unreadable (truncated or corrupt: {reason}); delete that file to rerun "
                "its method from the start, or rerun with --overwrite to start the whole run over."
            ) from None
        if (
            not isinstance(state, dict)
            or state.get("version") != CHECKPOINT_VERSION
            or state.get("fingerprint") != self.fingerprint
        ):
            raise ResumeError(
                f"checkpoint {path} was written by a different configuration or fbo_torch version "
                "(its fingerprint differs from this run's); delete it, or rerun with --overwrite to start over."
            )
        return state

    def verify_all(self) -> None:
        """Read every checkpoint now, so a corrupt one is named before any method runs (resume only),
        and keep what was read for :meth:`load` (each file is read once); temporary files of writes cut
        short by a kill are removed."""
        if not self.resume:
            return
        for tmp in self.folder.glob(".*.tmp"):
            tmp.unlink()
        for path in sorted(self.folder.glob("*.pt")):
            state = self.load(path)
            if state is not None:  # None only if the file vanished since the glob: load says so again
                self._verified[path] = state

    def save(self, path: Path, state: dict[str, Any]) -> None:
        buf = io.BytesIO()
        torch.save({"version": CHECKPOINT_VERSION, "fingerprint": self.fingerprint, **state}, buf)
        try:
            torch.load(io.BytesIO(buf.getvalue()), map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as err:
            raise TypeError(
                f"checkpoint {path}: the state holds objects other than tensors and plain containers, which a "
                f"resume would refuse to load ({str(err).strip().splitlines()[0][:200]})."
            ) from None
        atomic_write_bytes(path, buf.getvalue())
