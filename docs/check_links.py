"""Check that no link of the built documentation leaves the site: ``python docs/check_links.py docs/_build/html``.

Every ``href`` and ``src`` of every HTML page is read. A link with a scheme (``https:``, ``mailto:``)
goes to the web on purpose and is not checked here (the machines that build the docs reach package
registries only); every other link must resolve to a file inside the site's folder: a relative link
that climbs out of it (``../../../configs/``, the repository a checkout happens to surround the site
with) or names a file the build did not write is reported with the page it is on, and the exit status
is 1. ``make docs`` runs it after Sphinx.
"""

from __future__ import annotations

import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name in ("href", "src") and value:
                self.links.append(value)


def broken_links(site: str | Path) -> list[str]:
    r"""``"page: link (why)"`` for every link of the HTML pages under ``site`` that leaves it or finds no file.

    Args:
        site: The built site's folder (``docs/_build/html``).

    Returns:
        One line per bad link, sorted (empty: every link stays inside the site).
    """
    site = Path(site).resolve()
    bad = []
    for page in sorted(site.rglob("*.html")):
        parser = _Links()
        parser.feed(page.read_text(encoding="utf-8", errors="replace"))
        for link in dict.fromkeys(parser.links):
            parts = urlsplit(link)
            if parts.scheme or parts.netloc or not parts.path:  # the web, or an anchor on the same page
                continue
            target = (site / unquote(parts.path).lstrip("/")) if parts.path.startswith("/") else None
            target = (target or page.parent / unquote(parts.path)).resolve()
            if target.is_dir():
                target = target / "index.html"
            where = page.relative_to(site).as_posix()
            if target != site and site not in target.parents:
                bad.append(f"{where}: {link} (leaves the site)")
            elif not target.is_file():
                bad.append(f"{where}: {link} (no such file in the site)")
    return sorted(bad)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python docs/check_links.py SITE_FOLDER", file=sys.stderr)
        return 2
    site = Path(args[0])
    if not (site / "index.html").is_file():
        print(f"error: {site} holds no built site (no index.html); run Sphinx first", file=sys.stderr)
        return 2
    bad = broken_links(site)
    for line in bad:
        print(f"error: {line}", file=sys.stderr)
    if bad:
        print(f"{len(bad)} link(s) of the site at {site} leave it or find no file", file=sys.stderr)
        return 1
    print(f"every link of the site at {site} stays inside it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
