import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_names_the_two_commands_first():
    text = README.read_text()
    first_block = re.search(r"```bash\n(.*?)```", text, re.S).group(1)
    assert first_block.splitlines()[0].startswith("make quickstart")
    assert first_block.splitlines()[1].startswith("make test")


def test_readme_python_snippet_runs(capsys):
    code = re.search(r"```python\n(.*?)```", README.read_text(), re.S).group(1)
    namespace: dict = {}
    exec(compile(code, str(README), "exec"), namespace)
    x, value, omega = namespace["x"], namespace["value"], namespace["omega"]
    assert omega.shape == (8, 100) and x.shape == (1, 2)
    assert ((x >= 0) & (x <= 1)).all()
    # the reported value is phi(x)^T omega_3
    rff = namespace["rff"]
    assert abs(float(rff(x) @ omega[3]) - float(value)) < 1e-8
