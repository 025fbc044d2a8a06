r"""The ServerApp: the DP-FTS-DE server of one federation over Flower's Grid.

Run it the Flower way: ``serverapp = "fbo_torch.flower.server_app:app"`` in the
app's ``pyproject.toml``. :func:`main` reads the run config and the server's
configuration from the environment it inherits from the SuperLink —
``FBO_SERVER_STATE`` (:mod:`~fbo_torch.flower.server_state`), ``FBO_AGENT_ROSTER``
and ``FBO_REQUIRE_ROSTER`` (:mod:`~fbo_torch.flower.roster`) — and runs the
federation (:func:`~fbo_torch.flower.server_loop.run_federation`: the exchanges,
the coordinator with its release mechanism and ledger, SecAgg+ for a secure
release).
"""

from __future__ import annotations

import os
from logging import INFO, WARNING

from flwr.app import Context
from flwr.common import log
from flwr.serverapp import Grid, ServerApp

from fbo_torch.flower.config import FlowerRunConfig
from fbo_torch.flower.roster import REQUIRE_ROSTER_ENV, ROSTER_ENV, AgentRoster
from fbo_torch.flower.server_loop import check_summary_path, report_path, run_federation, summary
from fbo_torch.flower.server_loop import plan_content as _plan_content  # noqa: F401  (a deviating server's tests)
from fbo_torch.flower.server_state import STATE_ENV, ServerState, other_federations

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """The ServerApp: the run config's federation on ``grid`` (roster and state folder from the environment).

    Args:
        grid: Flower's ``Grid``.
        context: The run's context (its ``run_config``).
    """
    config = FlowerRunConfig.from_run_config(context.run_config)
    roster = AgentRoster.from_env(config.num_agents)
    if roster is None and os.environ.get(REQUIRE_ROSTER_ENV, "").strip() not in ("", "0"):
        raise RuntimeError(
            f"{REQUIRE_ROSTER_ENV} is set but {ROSTER_ENV} names no agent roster: refusing to run "
            "without binding agents to node keys."
        )
    state = ServerState.for_federation(config.fingerprint())
    log(INFO, "server state (secret, ledger, rounds): %s", state.folder)
    if not os.environ.get(STATE_ENV, "").strip():
        for line in other_federations(state):
            log(WARNING, "%s", line)
    run_federation(grid, config, state=state, roster=roster)


__all__ = ["app", "check_summary_path", "main", "other_federations", "report_path", "run_federation", "summary"]
