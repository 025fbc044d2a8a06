import re
import unicodedata
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
#: Markdown files whose relative links must resolve: the README, the changelog, docs/ and the results' READMEs.
LINKED_DOCS = [
    README,
    ROOT / "CHANGELOG.md",
    *sorted((ROOT / "docs").glob("*.md")),
    *sorted((ROOT / "benchmarks" / "results").glob("*/README.md")),
]
MAX_README_LINES = 300

_BLOCK = re.compile(r"```python\n(.*?)```", re.S)
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def _python_blocks(section: str) -> list[str]:
    """The code of every python block of README section ``section``."""
    text = README.read_text()
    start = text.index(f"## {section}")
    end = text.index("\n## ", start + 1)
    return _BLOCK.findall(text[start:end])


def _block(section: str, index: int) -> str:
    return _python_blocks(section)[index]


def _run(code: str) -> dict:
    namespace: dict = {}
    exec(compile(code, str(README), "exec"), namespace)
    return namespace


def test_readme_names_the_two_commands_first():
    text = README.read_text()
    first_block = re.search(r"```bash\n(.*?)```", text, re.S).group(1)
    assert first_block.splitlines()[0].startswith("make quickstart")
    assert first_block.splitlines()[1].startswith("make test")


def test_readme_botorch_loop_snippets_are_the_ones_we_test():
    assert len(_python_blocks("In your own BoTorch loop")) == 3
    assert len(_python_blocks("Many acquisitions in one call")) == 1
    assert len(_python_blocks("In Ax")) == 1
    # every python block of the README is one of those, seeded, and prints what it shows
    blocks = _BLOCK.findall(README.read_text())
    assert len(blocks) == 5
    assert all("torch.manual_seed(0)" in b and "print(" in b for b in blocks)


def test_readme_commands_say_how_long_they_take():
    """Every command a user runs from the README (make, fbo-torch run, the demos) gives its time here."""
    commands = [
        line
        for block in re.findall(r"```bash\n(.*?)```", README.read_text(), re.S)
        for line in block.splitlines()
        if re.match(r"(make |fbo-torch |\S*run_demo|OWN_OBJECTIVES)", line)
    ]
    assert len(commands) >= 8
    untimed = [c for c in commands if not re.search(r"\d+(\.\d+)? (s|min)\b|on a GPU", c)]
    assert not untimed, untimed


def test_readme_python_snippet_runs(capsys):
    namespace = _run(_block("In your own BoTorch loop", 0))
    printed = capsys.readouterr().out
    assert "agent 3's message peaks at x = [" in printed
    _run(_block("In your own BoTorch loop", 0))
    assert capsys.readouterr().out == printed  # seeded: the same output every time
    x, value, omega = namespace["x"], namespace["value"], namespace["omega"]
    assert omega.shape == (8, 100) and x.shape == (1, 2)
    assert ((x >= 0) & (x <= 1)).all()
    # the reported value is phi(x)^T omega_3
    rff = namespace["rff"]
    assert abs(float(rff(x) @ omega[3]) - float(value)) < 1e-8


def test_readme_federated_loop_snippet_runs(capsys):
    # one agent's loop with FederatedThompsonSampling: every query inside the bounds, each used
    # message dropped once, and the loop continues (p_t = 1) whatever is left
    namespace = _run(_block("In your own BoTorch loop", 1))
    X, Y, f, unused = namespace["X"], namespace["Y"], namespace["f"], namespace["unused"]
    assert X.shape == (8, 2) and Y.shape == (8, 1)
    assert ((X >= 0) & (X <= 1)).all()
    torch.testing.assert_close(Y, f(X))
    assert len(unused) < 8  # p_t = 0 at t = 1: the first query used a message
    assert "best after 8 evaluations" in capsys.readouterr().out


def test_readme_transformed_federated_loop_snippet_runs(capsys):
    # the target normalizes raw Branin inputs, the map's lengthscale comes from the peers' data, and
    # the messages carry the input bounds they were fitted on: phi(T(x))^T omega at raw x
    namespace = _run(_block("In your own BoTorch loop", 2))
    X, Y, f, bounds = namespace["X"], namespace["Y"], namespace["f"], namespace["bounds"]
    fit, rff, acqf, messages = namespace["fit"], namespace["rff"], namespace["acqf"], namespace["messages"]
    assert X.shape == (12, 2) and Y.shape == (12, 1)
    assert ((X >= bounds[0]) & (X <= bounds[1])).all()
    torch.testing.assert_close(Y, f(X))
    # the fitted lengthscale is in normalized units, and the map was built with it
    assert 0.02 < fit.lengthscale < 2.0
    assert rff is fit.features and rff.num_features == fit.num_features
    # every message says it was fitted on Normalize(bounds), and the acquisition maps raw x there
    assert len(messages) == 6
    for message in messages:
        torch.testing.assert_close(message.input_bounds.to(bounds), bounds)
    x = X[-1:]
    torch.testing.assert_close(acqf.message_space(x), (x - bounds[0]) / (bounds[1] - bounds[0]))
    # -Branin is 0.397887 below zero at its optima: f is the function the snippet says
    optimum = torch.tensor([[torch.pi, 2.275]], dtype=torch.float64)
    torch.testing.assert_close(f(optimum), torch.tensor([[-0.397887]], dtype=torch.float64), atol=1e-6, rtol=0)
    assert "optimum -0.398" in capsys.readouterr().out


def test_readme_ax_snippet_runs_as_written(capsys):
    """Three Ax clients on a mixed space (float, integer, unordered choice): 4 Sobol trials, then FTS;
    every trial a valid arm, some FTS trials from peers' messages, and the best of each agent printed."""
    pytest.importorskip("ax")
    namespace = _run(_block("In Ax", 0))
    clients, federation = namespace["clients"], namespace["federation"]
    assert len(clients) == 3 and [len(node.history) for node in federation.agents] == [2, 2, 2]
    assert any(step.source != "own" for node in federation.agents for step in node.history)
    for client in clients:
        for trial in client._experiment.trials.values():
            params = trial.arm.parameters
            assert isinstance(params["x2"], int) and params["variant"] in ("a", "b", "c")
    out = capsys.readouterr().out
    assert len(re.findall(r"^agent \d: best branin [0-9.]+ at \{", out, re.M)) == 3


def test_readme_batched_acquisition_snippet_runs(capsys):
    # one call maximizes 32 LogEIs of a batched GP: one candidate per problem, inside the box, and
    # the value reported for problem b is its acquisition at its candidate
    namespace = _run(_block("Many acquisitions in one call", 0))
    candidates, values, acqf = namespace["candidates"], namespace["values"], namespace["acqf"]
    assert candidates.shape == (32, 1, 3) and values.shape == (32,)
    assert "32 problems, one call" in capsys.readouterr().out
    assert ((candidates >= 0) & (candidates <= 1)).all()
    with torch.no_grad():
        at = acqf(candidates.unsqueeze(0))  # 1 x 32 x 1 x 3: t-batch 1, model batch 32
    torch.testing.assert_close(at.reshape(32), values, atol=1e-8, rtol=1e-8)


def test_readme_is_a_short_guide_with_nothing_outside_the_repository():
    text = README.read_text()
    assert len(text.splitlines()) <= MAX_README_LINES
    assert "../" not in text
    assert not re.search(r"\bissues? #?\d+", text, re.I), "issue numbers belong in the tracker, not the README"
    assert not re.search(r"\bcommit [0-9a-f]{7,40}\b", text), "commit hashes belong in git, not the README"


def _slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    text = unicodedata.normalize("NFKC", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return {_slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, re.M)}


@pytest.mark.parametrize("doc", LINKED_DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve_to_files_in_the_repository(doc):
    text = re.sub(r"```.*?```", "", doc.read_text(), flags=re.S)
    bad = []
    for target in _LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        resolved = (doc.parent / path).resolve() if path else doc
        if ROOT not in resolved.parents and resolved != ROOT:
            bad.append(f"{target} (outside the repository)")
        elif not resolved.exists():
            bad.append(f"{target} (no such file)")
        elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
            bad.append(f"{target} (no heading #{anchor})")
    assert not bad, f"{doc.relative_to(ROOT)}: broken links: {bad}"


#: The committed peer benchmarks the README's recommendation is read from (benchmarks/results/peers/*.md).
PEER_BENCHMARKS = (
    "tetci2019_d3",
    "tetci2019_d3_newcomer",
    "tetci2019_d10",
    "svm_landmine_d2",
    "svm_landmine_d2_newcomer",
    "gecco2020_d5",
    "gecco2020_d5_newcomer",
    "tevc2024_d5",
    "tevc2024_d5_newcomer",
    "arxiv2017_d5",
    "synthetic_together",
    "synthetic_newcomer",
)


def _per_agent(configuration: str, reference: str = "local") -> list[tuple[int, int, int, int]]:
    """``(agents, better by mean, distinguishably better, distinguishably worse)`` of ``configuration`` against
    ``reference`` on each committed peer benchmark (benchmarks/results/peers/*.md, paired differences)."""
    out = []
    for name in PEER_BENCHMARKS:
        text = (ROOT / "benchmarks" / "results" / "peers" / f"{name}.md").read_text()
        heading = re.search(rf"Paired difference[^\n*]* to \*\*{re.escape(reference)}\*\*", text)
        assert heading is not None, (name, reference)
        table = text[heading.end() :].split("\n\n")[1]
        (row,) = [line for line in table.splitlines() if line.startswith(f"| {configuration} |")]
        cells = [c.strip() for c in row.strip("|").split("|")]
        diffs = [float(c.rstrip("*")) for c in cells[3:]]
        out.append((len(diffs), sum(d < 0 for d in diffs), int(cells[1]), int(cells[2])))
    return out


def test_the_recommendation_says_what_the_committed_numbers_say_per_agent():
    """The README's recommended federated configuration is stated with its per-agent record against the local
    engine on every committed peer benchmark, as compare.py's tables give it (not by mean rank alone)."""
    text = " ".join(README.read_text().split())
    paragraph = text.split("**What we recommend when agents tune together:**")[1].split("**")[0]
    assert "algorithm: transfer" in paragraph
    per = _per_agent("transfer")
    agents, better = sum(p[0] for p in per), sum(p[1] for p in per)
    split = ", ".join(f"{p[1]}/{p[0]}" for p in per)
    words = {0: "none", 1: "1"}
    claim = (
        f"per agent better by mean on {better} of their {agents} agents ({split}), distinguishably better on "
        f"{words.get(sum(p[2] for p in per), sum(p[2] for p in per))} and worse on "
        f"{words.get(sum(p[3] for p in per), sum(p[3] for p in per))}"
    )
    assert claim in paragraph, (claim, paragraph)
