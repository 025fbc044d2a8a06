"""The round handler's own checks: which agent a node plays, and each round answered once (in the node state)."""

import subprocess
import sys

import pytest
from flwr.app import Context, RecordDict

from fbo_torch.flower.client_round import ReplayRefused, agent_id_of, agent_secret_of, claim_round
from fbo_torch.flower.secagg_records import AGENT_SECRET, ANSWERED


def _context(**node_config):
    return Context(run_id=1, node_id=7, state=RecordDict(), node_config=node_config, run_config={})


def test_a_node_plays_its_partition_id_and_one_without_it_is_told_the_flag():
    assert agent_id_of(_context(**{"partition-id": 3})) == 3
    with pytest.raises(ValueError, match="--node-config partition-id=n"):
        agent_id_of(_context())


def test_each_round_is_claimed_once_in_order_and_the_secret_survives_the_claims():
    ctx = _context(**{"partition-id": 0})
    claim_round(ctx, 0, 1, num_rounds=3)
    secret = agent_secret_of(ctx)  # drawn at the first claim, kept with the round
    claim_round(ctx, 0, 3, num_rounds=3)  # a round may be skipped (the agent was not asked)
    assert ctx.state.config_records[AGENT_SECRET][ANSWERED] == 3
    assert agent_secret_of(ctx) == secret and len(secret) == 32
    for again in (1, 3):  # an earlier round, the same round
        with pytest.raises(ReplayRefused, match=f"refuses to answer round {again}: it answered round 3 last"):
            claim_round(ctx, 0, again, num_rounds=3)
    with pytest.raises(ReplayRefused, match="the run has 3 rounds"):
        claim_round(_context(), 0, 4, num_rounds=3)


def test_a_forged_answered_round_in_the_state_is_refused():
    ctx = _context()
    claim_round(ctx, 0, 1, num_rounds=2)
    ctx.state.config_records[AGENT_SECRET][ANSWERED] = "1"
    with pytest.raises(ReplayRefused, match="not a round"):
        claim_round(ctx, 0, 2, num_rounds=2)


def test_the_round_process_imports_no_opacus():
    # a round's process checks privacy settings but computes no epsilon unless its node sets a floor
    code = "import sys, fbo_torch.flower.client_round; print('opacus' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
