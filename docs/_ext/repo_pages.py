"""The repository's files that the guides link to, copied into the site, so no link leaves it.

The guides in ``docs/`` link to files elsewhere in the repository: the README, the changelog, the
example configs, the results' READMEs and their JSON files and plots. A link such as
``../configs/fts_synthetic.yaml`` works in a checkout but leaves a hosted site. When the build starts
(``builder-inited``), this extension follows every such link from ``docs/*.md`` (and, transitively,
from the Markdown files it reaches) and mirrors its target under ``docs/_repo/`` (recreated on each
build, ignored by git):

* a Markdown file becomes a page of the site (marked ``orphan``: it is reached by links, not the
  table of contents), whose own links are followed in turn;
* a folder becomes a page listing its files (each mirrored), with its ``README.md`` as the page when
  it has one;
* any other file (YAML, JSON, images, Python) is copied as it is: MyST links it as a download, and
  Sphinx copies images into the site.

Each page's links are then rewritten (``source-read``) to point at the mirror, or at the guide itself
for a link into ``docs/``; links with a scheme (``https:``) and anchors are left as they are.
``docs/check_links.py`` (run by ``make docs``) then checks that every link of the built site stays
inside it and finds its file.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

from sphinx.application import Sphinx

#: The mirror's folder inside the docs source folder.
MIRROR = "_repo"
#: ``[text](target)`` and ``![alt](target)`` in Markdown (the target without spaces).
_LINK = re.compile(r"(!?\[[^\]]*\]\()([^)\s]+)(\))")
_FENCE = re.compile(r"^(```|~~~)")


def _links(text: str) -> list[str]:
    """The link targets of a Markdown text, outside code blocks."""
    out, fenced = [], False
    for line in text.splitlines():
        if _FENCE.match(line.strip()):
            fenced = not fenced
        elif not fenced:
            out += [m.group(2) for m in _LINK.finditer(line)]
    return out


def _local(target: str) -> tuple[str, str] | None:
    """``(path, '#anchor' or '')`` of a relative link; ``None`` for a URL or a bare anchor."""
    if re.match(r"[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith("#") or not target:
        return None
    path, hash_, anchor = target.partition("#")
    return path, hash_ + anchor


class Mirror:
    """The repository files reachable from the guides, and where each lives in the site's sources."""

    def __init__(self, srcdir: Path) -> None:
        self.srcdir = srcdir.resolve()
        self.root = self.srcdir.parent
        self.mirror = self.srcdir / MIRROR
        self.files: set[Path] = set()  # repository files outside docs/ that the site holds
        self.folders: set[Path] = set()  # repository folders a guide links to (a listing page each)

    def site_path(self, real: Path) -> Path:
        """Where a repository path lives in the site's sources (a guide: itself; a folder: its page)."""
        if real == self.srcdir or self.srcdir in real.parents:
            return real
        rel = real.relative_to(self.root)
        if real.is_dir():
            readme = real / "README.md"
            return self.mirror / rel / ("README.md" if readme.is_file() else "index.md")
        return self.mirror / rel

    def real_path(self, source: Path) -> Path:
        """The repository file a source of the site stands for (a mirrored page: its original)."""
        source = source.resolve()
        if self.mirror in source.parents:
            return self.root / source.relative_to(self.mirror)
        return source

    def target(self, page: Path, target: str) -> Path | None:
        """The repository path a link of ``page`` (a repository file) points to, if it is in the repository."""
        local = _local(target)
        if local is None or not local[0]:
            return None
        real = (page.parent / local[0]).resolve()
        if real != self.root and self.root not in real.parents or not real.exists():
            return None
        return real

    def collect(self) -> None:
        """Follow the guides' links (and the mirrored pages' in turn) to every repository file they reach."""
        queue = sorted(p for p in self.srcdir.glob("*.md"))
        seen: set[Path] = set(queue)
        while queue:
            page = queue.pop()
            for link in _links(page.read_text(encoding="utf-8")):
                real = self.target(page, link)
                if real is None or real == self.srcdir or self.srcdir in real.parents:
                    continue
                for path in self._reach(real):
                    if not path.is_file():
                        continue
                    self.files.add(path)
                    if path.suffix == ".md" and path not in seen:
                        seen.add(path)
                        queue.append(path)

    def _reach(self, real: Path) -> list[Path]:
        """The files a link to ``real`` brings into the site: the file, or a folder's files (a subfolder by its
        README, else by its own listing)."""
        if not real.is_dir():
            return [real]
        self.folders.add(real)
        out = []
        for path in sorted(real.iterdir()):
            if path.name.startswith((".", "__")):
                continue
            if path.is_dir():
                out += [path / "README.md"] if (path / "README.md").is_file() else self._reach(path)
            else:
                out.append(path)
        return out

    def write(self) -> None:
        """Recreate ``docs/_repo``: the files, and a listing page for each folder without a README."""
        if self.mirror.exists():
            shutil.rmtree(self.mirror)
        for path in sorted(self.files):
            dest = self.site_path(path)
            dest.parent.mkdir(parents=True, exist_ok=True)
            if path.suffix == ".md":
                dest.write_text("---\norphan: true\n---\n\n" + path.read_text(encoding="utf-8"), encoding="utf-8")
            else:
                shutil.copyfile(path, dest)
        for folder in sorted(self.folders):
            if (folder / "README.md").is_file():
                continue
            rel = folder.relative_to(self.root).as_posix()
            lines = ["---", "orphan: true", "---", "", f"# `{rel}/`", "", f"The files of `{rel}/` in the repository:"]
            lines.append("")
            for entry in sorted(folder.iterdir()):
                if entry in self.files:
                    lines.append(f"* [`{entry.name}`]({entry.name})")
                elif entry.is_dir() and (entry in self.folders or (entry / "README.md") in self.files):
                    page = self.site_path(entry).relative_to(self.site_path(folder).parent).as_posix()
                    lines.append(f"* [`{entry.name}/`]({page})")
            page = self.site_path(folder)
            page.parent.mkdir(parents=True, exist_ok=True)
            page.write_text("\n".join(lines) + "\n", encoding="utf-8")

    def rewrite(self, source: Path, text: str) -> str:
        """``text`` of the page ``source`` with each link to a repository path pointing at its place in the site."""
        page = self.real_path(source)
        here = source.resolve().parent

        def replace(m: re.Match[str]) -> str:
            local = _local(m.group(2))
            real = self.target(page, m.group(2))
            if local is None or real is None:
                return m.group(0)
            dest = self.site_path(real)
            if dest.suffix != ".md" and not dest.exists():
                return m.group(0)  # not mirrored (a guide's own file); left for Sphinx to judge
            rel = Path(os.path.relpath(dest, here)).as_posix()
            return f"{m.group(1)}{rel}{local[1]}{m.group(3)}"

        out, fenced = [], False
        for line in text.splitlines(keepends=True):
            if _FENCE.match(line.strip()):
                fenced = not fenced
            out.append(line if fenced else _LINK.sub(replace, line))
        return "".join(out)


def _mirror(app: Sphinx) -> Mirror:
    mirror: Mirror = app.env.fbo_mirror if hasattr(app.env, "fbo_mirror") else Mirror(Path(app.srcdir))
    app.env.fbo_mirror = mirror  # type: ignore[attr-defined]
    return mirror


def builder_inited(app: Sphinx) -> None:
    mirror = Mirror(Path(app.srcdir))
    mirror.collect()
    mirror.write()
    app.env.fbo_mirror = mirror  # type: ignore[attr-defined]


def source_read(app: Sphinx, docname: str, source: list[str]) -> None:
    path = Path(app.env.doc2path(docname))
    if path.suffix == ".md":
        source[0] = _mirror(app).rewrite(path, source[0])


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("builder-inited", builder_inited)
    app.connect("source-read", source_read)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
