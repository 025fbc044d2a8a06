"""What ``benchmarks/collect_results.py`` keeps of a run's results.json."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import collect_results


def _method(failed_count, flags):
    return {
        "name": "TS",
        "runs": [[1.0, 0.5]],
        "queries": [[[0.1]]],
        "failed": flags,
        "evaluation_failures": {"evaluations": 2, "failed": failed_count, "kinds": {}, "by_agent_round": []},
    }


def test_compaction_drops_the_bulk_and_keeps_what_a_failure_says():
    results = {"scenarios": [{"methods": [_method(0, [[False, False]]), _method(1, [[False, True]])]}]}
    out = collect_results.compact(results)
    clean, failing = out["scenarios"][0]["methods"]
    assert "queries" not in clean and "failed" not in clean and clean["runs"] == [[1.0, 0.5]]
    assert failing["failed"] == [[False, True]]  # a failure keeps its flags
    assert "failure flags" in out["note"]
    assert "failed" in results["scenarios"][0]["methods"][0]  # the input is not changed


def test_a_dp_record_keeps_its_averaged_curves_and_the_broadcast_share_only():
    m = {
        "name": "FTS-DE",
        "repetition_mean": [0.5, 0.4],
        "runs": [[0.5, 0.4]],
        "agents": [0],
        "repetitions": [0],
        "used_server": [[True]],
        "fraction_queries_from_server": [1.0],
    }
    out = collect_results.compact({"scenarios": [{"methods": [m]}]})["scenarios"][0]["methods"][0]
    assert set(out) == {"name", "repetition_mean", "fraction_queries_from_server"}
