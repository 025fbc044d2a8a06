import re
from pathlib import Path

import torch

README = Path(__file__).resolve().parents[1] / "README.md"


def _python_blocks(section: str) -> list[str]:
    text = README.read_text()
    start = text.index(f"## {section}")
    end = text.index("\n## ", start + 1)
    return re.findall(r"```python\n(.*?)```", text[start:end], re.S)


def _run(code: str) -> dict:
    namespace: dict = {}
    exec(compile(code, str(README), "exec"), namespace)
    return namespace


def test_readme_names_the_two_commands_first():
    text = README.read_text()
    first_block = re.search(r"```bash\n(.*?)```", text, re.S).group(1)
    assert first_block.splitlines()[0].startswith("make quickstart")
    assert first_block.splitlines()[1].startswith("make test")


def test_readme_botorch_loop_snippets_are_the_two_we_test():
    assert len(_python_blocks("In your own BoTorch loop")) == 2


def test_readme_python_snippet_runs(capsys):
    namespace = _run(_python_blocks("In your own BoTorch loop")[0])
    x, value, omega = namespace["x"], namespace["value"], namespace["omega"]
    assert omega.shape == (8, 100) and x.shape == (1, 2)
    assert ((x >= 0) & (x <= 1)).all()
    # the reported value is phi(x)^T omega_3
    rff = namespace["rff"]
    assert abs(float(rff(x) @ omega[3]) - float(value)) < 1e-8


def test_readme_federated_loop_snippet_runs(capsys):
    # one agent's loop with FederatedThompsonSampling: every query inside the bounds, each used
    # message dropped once, and the loop continues (p_t = 1) whatever is left
    torch.manual_seed(0)
    namespace = _run(_python_blocks("In your own BoTorch loop")[1])
    X, Y, f, unused = namespace["X"], namespace["Y"], namespace["f"], namespace["unused"]
    assert X.shape == (8, 2) and Y.shape == (8, 1)
    assert ((X >= 0) & (X <= 1)).all()
    torch.testing.assert_close(Y, f(X))
    assert len(unused) < 8  # p_t = 0 at t = 1: the first query used a message
    assert "best after 8 evaluations" in capsys.readouterr().out
