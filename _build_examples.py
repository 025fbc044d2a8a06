"""Build hook: the wheel carries the example configs and programs as package data.

``configs/`` and ``examples/`` live at the repository's top level, where the README and the tests use
them; setuptools' ``build_py`` (named in pyproject.toml's ``[tool.setuptools.cmdclass]``) copies them into
the built package as ``fbo_torch/_examples/configs`` and ``fbo_torch/_examples/examples``, where
``fbo_torch.utils.paths.shipped_examples`` finds them and ``fbo-torch examples DIR`` copies them from.
An editable install reads the checkout's folders instead (nothing is copied).
"""

from __future__ import annotations

from pathlib import Path

from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
FOLDERS = ("configs", "examples")


class BuildPy(build_py):
    """``build_py`` that also copies ``configs/`` and ``examples/`` into ``fbo_torch/_examples``."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        for folder in FOLDERS:
            for path in sorted((ROOT / folder).rglob("*")):
                rel = path.relative_to(ROOT)
                if path.is_file() and "__pycache__" not in rel.parts and not path.name.startswith("."):
                    target = Path(self.build_lib) / "fbo_torch" / "_examples" / rel
                    self.mkpath(str(target.parent))
                    self.copy_file(str(path), str(target))
