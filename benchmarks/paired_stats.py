r"""The paired comparison every study reports: per-run differences, their mean ± s.e., a t-test.

Every method of a study starts run ``r`` from the same initial points, so two
methods are compared run by run: the mean of the differences, its standard
error, and a two-sided paired t-test at 95% (``df = runs − 1``).
"""

from __future__ import annotations

from collections.abc import Sequence


def paired_difference(diffs: Sequence[float]) -> dict:
    r"""Mean ± s.e. of per-run differences, the t-test's critical value and verdict, and the runs on each side.

    Returns:
        ``runs``, ``diff`` (mean), ``se``, ``t_critical``, ``distinguishable``
        (``|diff| > t_critical · se``), ``better`` / ``worse`` (runs with a
        negative / positive difference). With one run ``se`` and ``t_critical``
        are NaN and nothing is distinguishable.
    """
    from scipy import stats

    n = len(diffs)
    mean = sum(diffs) / n
    se = (sum((x - mean) ** 2 for x in diffs) / (n - 1) / n) ** 0.5 if n > 1 else float("nan")
    crit = float(stats.t.ppf(0.975, n - 1)) if n > 1 else float("nan")
    return {
        "runs": n,
        "diff": mean,
        "se": se,
        "t_critical": crit,
        "distinguishable": bool(se > 0 and abs(mean) > crit * se),
        "better": sum(d < 0 for d in diffs),
        "worse": sum(d > 0 for d in diffs),
    }
