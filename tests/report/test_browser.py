"""The federation report in a real headless browser (Chromium over the DevTools protocol): for a
(shrunk) quickstart run, a DP-FTS-DE run and a Flower run, the page loads without a console error,
requests nothing beyond itself, runs its script, shows every section of every block, and its slider
redraws the who-helped-whom matrix. Skipped, saying why, where no Chromium can be had (chromium.py)."""

import sys
from pathlib import Path

import pytest

pytest.importorskip("websockets")

from chromium import Browser, chromium
from test_accounting import DP
from test_cli import _tiny_quickstart

from fbo_torch.cli import main
from fbo_torch.report.page import SECTIONS

DEMO = Path(__file__).resolve().parents[2] / "examples" / "flower_app" / "pyproject.toml"


def _run(tmp_path, cfg, name):
    out = tmp_path / name
    assert main(["run", str(cfg), "--out", str(out), "--no-progress", "--quiet"]) == 0
    return out / "report.html"


def _flower(tmp_path):
    """The Flower demo's run of DP-FTS-DE on the in-process grid (the ServerApp's own loop) with its summary, so the
    ServerApp writes its report beside it."""
    pytest.importorskip("flwr")
    toml = pytest.importorskip("tomllib" if sys.version_info >= (3, 11) else "tomli")  # tomli: flwr's, on 3.10
    from flower_grid import InProcessGrid

    from fbo_torch.flower import client_app, server_app
    from fbo_torch.flower.config import FlowerRunConfig

    # the demo's run config (examples/flower_app), with what run_demo.sh sets, its summary, and no waiting
    run_config = toml.loads(DEMO.read_text())["tool"]["flwr"]["app"]["config"]
    run_config.update({"report-best": True, "summary-path": str(tmp_path / "summary.json")})
    run_config.update({"round-timeout": 10.0, "min-nodes-timeout": 0.0})
    grid = InProcessGrid(client_app.app, run_config, run_config["num-agents"])
    coord = server_app.run_federation(
        grid, FlowerRunConfig.from_run_config(run_config), echo=lambda _: None, poll_interval=0.0
    )
    page = Path(server_app.report_path(run_config["summary-path"]))
    secret = coord.server.randomness._secret.hex()
    assert secret not in page.read_text()  # the server's secret stays in its state folder
    return page


@pytest.fixture(scope="module")
def browser():
    b = Browser(chromium())
    yield b
    b.close()


@pytest.mark.parametrize("kind", ["quickstart", "dp_fts_de", "flower"])
def test_the_report_opens_in_a_browser_without_errors_and_shows_every_section(tmp_path, browser, kind):
    if kind == "quickstart":
        page = _run(tmp_path, _tiny_quickstart(tmp_path), "qs")
    elif kind == "dp_fts_de":
        cfg = tmp_path / "dp.yaml"
        cfg.write_text(DP)
        page = _run(tmp_path, cfg, "dp")
    else:
        page = _flower(tmp_path)
    browser.open(page)
    assert browser.evaluate("document.body.dataset.ready") == "1"  # the page's script ran to its end
    assert browser.console_errors() == []
    outside = [u for u in browser.requests() if not u.startswith(("file:", "data:"))]
    assert outside == [], "the page must load nothing from the network"
    blocks = browser.evaluate(
        "Array.from(document.querySelectorAll('.method')).map(m => Array.from("
        "m.querySelectorAll('section[data-section]')).filter(s => s.offsetHeight > 0 && s.textContent.trim())"
        ".map(s => s.dataset.section))"
    )
    assert blocks and all(b == [name for name, _ in SECTIONS] for b in blocks), blocks
    if kind != "flower":  # the slider redraws the matrix at the first round
        title = browser.evaluate(
            "(() => { const box = document.querySelector('.helpmap'); const s = box.querySelector('input');"
            "s.value = 0; s.dispatchEvent(new Event('input')); return box.querySelector('rect.cell title').textContent;"
            "})()"
        )
        assert "up to round 1:" in title
        assert browser.console_errors() == []
