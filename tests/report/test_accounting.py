"""Per-agent accounting, fairness indices and free-rider flags: the maths on hand-made numbers, the
test's size and power by simulation with fixed seeds, and the invariants of real (tiny) runs."""

import csv
import io
import json
import math

import pytest
import torch

from fbo_torch.cli import main
from fbo_torch.experiments.accounting import (
    BROADCAST,
    OWN,
    accounting,
    binomial_cdf,
    flag_free_riders,
    group_mean_stderr,
    help_over_rounds,
    incumbent_gains,
)
from fbo_torch.experiments.fairness import fair_regret, fairness_indices
from fbo_torch.experiments.posterior_gain import method_posterior_gains

TOGETHER = """
experiment: fts
name: tiny-together
seed: 0
objective: {type: gp_grid, num_groups: 1, agents_per_group: 4, grid_size: 50, perturbation: 0.02, lengthscale: 0.1}
runs: {num_inits: 3}
history: {mode: together}
defaults: {num_iterations: 6, num_init: 1, num_features: 20, gp_refit_every: 0, rff_lengthscale: 0.1,
           communication: every-round}
methods:
  - {name: TS, algorithm: ts}
  - {name: FTS, algorithm: fts}
"""

DP = """
experiment: dp_fts_de
name: tiny-dp
seed: 3
objective: {type: gp_grid, num_groups: 1, agents_per_group: 4, grid_size: 50, perturb_first: true}
runs: {num_inits: 2}
privacy: {accountant: rdp, delta: 1.0e-5}
defaults: {num_iterations: 5, num_init: 2, num_features: 10, gp_refit_every: 0}
methods:
  - {name: TS, algorithm: ts}
  - {name: DP-FTS-DE, algorithm: fts_de, num_regions: 2, sample_rate: 0.5, noise_multiplier: 1.0, clip_norm: 5.0}
"""


def run(tmp_path, text, name):
    cfg = tmp_path / f"{name}.yaml"
    cfg.write_text(text)
    out = tmp_path / name
    assert main(["run", str(cfg), "--out", str(out), "--no-progress", "--quiet"]) == 0
    return out


# ----------------------------------------------------------------- fairness maths
def test_fair_regret_weighs_the_worst_agent_first():
    R = torch.tensor([[1.0, 3.0, 2.0], [0.0, 0.0, 5.0]], dtype=torch.float64)
    assert fair_regret(R, 1.0).tolist() == [6.0, 5.0]  # ρ = 1: the total regret
    assert fair_regret(R, 0.0).tolist() == [3.0, 5.0]  # ρ = 0: the worst agent's
    assert fair_regret(R, 0.5).tolist() == [3 + 0.5 * 2 + 0.25 * 1, 5.0]  # sorted from the largest down
    with pytest.raises(ValueError, match="`rho` must be a number in"):
        fair_regret(R, 1.5)


def test_fairness_indices_count_the_agents_that_lost():
    regret = torch.tensor([0.1, 0.4, 0.2, 0.3])
    gain = torch.tensor([0.2, -0.1, -0.3, 0.05])
    se = torch.tensor([0.01, 0.2, 0.1, 0.01])
    f = fairness_indices(regret, gain=gain, gain_stderr=se)
    assert f["worst_regret"] == pytest.approx(0.4) and f["worst_agent"] == 1
    assert f["share_lost"] == 0.5  # agents 1 and 2
    assert f["share_lost_significantly"] == 0.25  # only agent 2: -0.3 + 2 * 0.1 < 0, -0.1 + 0.4 > 0
    assert f["gain_std"] == pytest.approx(float(gain.double().std()))
    assert f["fair_regret"]["0.0"] == pytest.approx(0.4) and f["fair_regret"]["1.0"] == pytest.approx(1.0)


def test_group_means_and_standard_errors_are_those_of_each_group():
    g = torch.tensor([0, 1, 0, 1, 1, 2])
    v = torch.tensor([1.0, 2.0, 3.0, 4.0, 9.0, 7.0])
    mean, se, n = group_mean_stderr(v, g, 3)
    assert mean.tolist() == [2.0, 5.0, 7.0] and n.tolist() == [2, 3, 1]
    assert se[0] == pytest.approx(torch.tensor([1.0, 3.0]).std() / math.sqrt(2))
    assert se[1] == pytest.approx(torch.tensor([2.0, 4.0, 9.0]).std() / math.sqrt(3))
    assert math.isnan(se[2])  # one run: no standard error


def test_who_helped_whom_adds_each_rounds_gain_to_the_source_followed():
    best = torch.tensor([[0.0, 0.5, 0.5, 0.9], [0.0, 0.0, 0.2, 0.2]], dtype=torch.float64)
    sources = torch.tensor([[3, OWN, 3], [BROADCAST, 3, OWN]])
    gains = incumbent_gains(best)
    torch.testing.assert_close(gains, torch.tensor([[0.5, 0.0, 0.4], [0.0, 0.2, 0.0]], dtype=torch.float64))
    cols = torch.tensor([BROADCAST, OWN, 3])
    help_m, follows, wins = help_over_rounds(sources, gains, torch.tensor([0, 1]), cols, 2)
    assert help_m.shape == (3, 2, 3)
    torch.testing.assert_close(help_m[-1], torch.tensor([[0.0, 0.0, 0.9], [0.0, 0.0, 0.2]], dtype=torch.float64))
    # after round 1
    torch.testing.assert_close(help_m[0], torch.tensor([[0.0, 0.0, 0.5], [0.0, 0.0, 0.0]], dtype=torch.float64))
    assert follows[-1].tolist() == [[0, 1, 2], [1, 1, 1]] and wins[-1].tolist() == [[0, 0, 2], [0, 0, 1]]


def test_binomial_cdf_is_the_exact_sum():
    for n, k, p in [(10, 3, 0.4), (25, 0, 0.1), (7, 7, 0.9), (40, 12, 0.35)]:
        exact = sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k + 1))
        assert binomial_cdf(k, n, torch.tensor(p, dtype=torch.float64)).item() == pytest.approx(exact, rel=1e-10)


def test_the_free_rider_test_has_its_size_and_finds_a_useless_peer():
    """Size: with every peer's follows improving at the same rate, a level-0.01 test (conservative for
    a discrete statistic; the pooled rate is estimated from the others' 4 x 60 follows) flags about 1 %
    of peers: over 2000 peers, more than 45 flags (mean 20, s.d. 4.5) would be a 5-sigma excess.
    Power: a peer whose followers improve at 5 % instead of 40 % over 60 follows has k ~ 3 against an
    expected 24 (P(X <= 3 | 60, 0.4) ~ 1e-9): it is flagged in essentially every federation."""
    g = torch.Generator().manual_seed(0)
    n = torch.full((400, 5), 60.0)
    honest = torch.binomial(n, torch.full_like(n, 0.4), generator=g)
    flags = torch.stack([flag_free_riders(n[i], honest[i])[0] for i in range(400)])
    assert int(flags.sum()) <= 45
    rider = honest.clone()
    rider[:, 2] = torch.binomial(n[:, 2], torch.full_like(n[:, 2], 0.05), generator=g)
    flagged = torch.stack([flag_free_riders(n[i], rider[i])[0] for i in range(400)])
    assert flagged[:, 2].double().mean() >= 0.99
    assert flagged[:, [0, 1, 3, 4]].double().mean() <= 0.03
    few = flag_free_riders(torch.tensor([3.0, 60.0, 60.0]), torch.tensor([0.0, 24.0, 24.0]))
    assert not bool(few[0][0]) and math.isnan(few[1][0])  # 3 follows: too little evidence, untested


# ----------------------------------------------------------------- real runs
def test_a_together_run_accounts_every_rounds_gain_and_pairs_it_with_its_local_run(tmp_path):
    out = run(tmp_path, TOGETHER, "fts")
    res = json.loads((out / "results.json").read_text())
    acc = json.loads((out / "accounting.json").read_text())
    assert acc == json.loads(json.dumps(accounting(res)))  # what the run wrote is what the report recomputes
    (fts,) = acc["scenarios"][0]["methods"]
    ts, rec = res["scenarios"][0]["methods"]
    assert fts["name"] == "FTS" and fts["local"]["name"] == "TS" and fts["agents"] == [0, 1, 2, 3]
    assert fts["paired_starts"] and fts["paired_runs"] == 12  # same seed, same initial points
    T = 6
    # every round of every run followed exactly one source
    assert sum(map(sum, fts["followed"])) == pytest.approx(4 * T)
    # the sources' gains add up to each agent's whole improvement (mean per run)
    best = torch.tensor(rec["best_value_runs"], dtype=torch.float64)
    total = (best[:, -1] - best[:, 0]).view(4, 3).mean(-1)
    assert [sum(row) for row in fts["gained"]] == pytest.approx(total.tolist(), abs=1e-12)
    # the gain from federating is the paired difference of final regrets, per agent
    final = {m["name"]: torch.tensor(m["runs"], dtype=torch.float64)[:, -1] for m in (ts, rec)}
    diff = (final["TS"] - final["FTS"]).view(4, 3)
    assert fts["gain"] == pytest.approx(diff.mean(-1).tolist(), abs=1e-12)
    assert fts["gain_stderr"] == pytest.approx((diff.std(-1) / math.sqrt(3)).tolist(), abs=1e-12)
    assert fts["gain_mean"] == pytest.approx(float(diff.mean()), abs=1e-12)
    assert fts["fairness"]["share_lost"] == pytest.approx(float((diff.mean(-1) < 0).double().mean()))
    assert {c["peer"] for c in fts["contributions"]} <= {0, 1, 2, 3}
    # posterior gain: the sources' shares add up to each agent's per-run total, the peers' to what they gave
    pg = method_posterior_gains(rec, res["scenarios"][0]["domain_bounds"])
    assert pg is not None and pg.information.shape == (12, T)
    for key, per_round in (("posterior_gained", pg.belief_gain), ("information_gained", pg.information)):
        assert [sum(row) for row in fts[key]] == pytest.approx(
            per_round.sum(-1).view(4, 3).mean(-1).tolist(), abs=1e-12
        )
    sources = torch.tensor(rec["sources"])
    for c in fts["contributions"]:
        assert c["information_given"] == pytest.approx(float(pg.information[sources == c["peer"]].sum()), abs=1e-9)
    rows = [r for r in csv.DictReader(io.StringIO((out / "results.csv").read_text())) if r["method"] == "FTS"]
    assert all(r["source"] == r["belief_gain"] == r["information"] == "" for r in rows if r["iteration"] == "0")
    later = [r for r in rows if r["iteration"] != "0"]
    assert {r["source"] for r in later} <= {"own", "0", "1", "2", "3"}
    assert sum(float(r["information"]) for r in later) == pytest.approx(float(pg.information.sum()), rel=1e-12)
    page = (out / "report.html").read_text()
    assert "Posterior gain per run" in page and "information given (nats)" in page


def test_a_dp_run_accounts_the_broadcast_and_its_epsilon(tmp_path):
    out = run(tmp_path, DP, "dp")
    res = json.loads((out / "results.json").read_text())
    (dp,) = json.loads((out / "accounting.json").read_text())["scenarios"][0]["methods"]
    rec = res["scenarios"][0]["methods"][1]
    assert dp["sources"] == ["broadcast", "own"] and dp["contributions"] == [] and dp["free_riders"] == []
    used = torch.tensor(rec["used_server"], dtype=torch.float64)  # B x T
    assert [row[0] for row in dp["followed"]] == pytest.approx(used.sum(-1).view(2, 4).mean(0).tolist())
    assert dp["privacy"]["epsilon"] == rec["epsilon"] and dp["privacy"]["delta"] == 1e-5
    assert dp["privacy"]["accountant"] == "rdp"
    assert not dp["paired_starts"]  # distributed exploration: the local run starts elsewhere
    # posterior gain of the rounds that followed the broadcast, per agent (mean per run)
    assert len(rec["queries"]) == len(rec["observations"]) == 8  # 2 repetitions x 4 agents
    pg = method_posterior_gains(rec, res["scenarios"][0]["domain_bounds"])
    assert pg is not None
    from_server = (pg.information * used).sum(-1).view(2, 4).mean(0)
    assert [row[0] for row in dp["information_gained"]] == pytest.approx(from_server.tolist(), abs=1e-12)
    rows = list(csv.DictReader(io.StringIO((out / "results.csv").read_text())))
    assert {r["source"] for r in rows if r["method"] == "DP-FTS-DE" and r["iteration"] != "0"} == {"own", "broadcast"}


def test_an_agent_without_a_valid_evaluation_is_the_worst_off():
    """An agent none of whose evaluations succeeded has infinite regret: the fair regret is infinite for every
    ρ (it is the largest, weighted 1), the other agents' order and weights are unchanged, and NaN is refused."""
    regret = torch.tensor([0.5, math.inf, 0.25], dtype=torch.float64)
    for rho in (0.0, 0.5, 1.0):
        assert fair_regret(regret, rho).item() == math.inf
    both = torch.tensor([math.inf, math.inf, 0.1], dtype=torch.float64)
    assert fair_regret(both, 0.0).item() == math.inf  # a zero weight never turns inf into NaN
    with pytest.raises(ValueError, match="`regret`"):
        fair_regret(torch.tensor([0.1, math.nan], dtype=torch.float64), 0.5)
