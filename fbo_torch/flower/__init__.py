r"""DP-FTS-DE deployed on Flower (optional extra ``fbo_torch[flower]``).

One round logic, two transports: the batched simulator
(:mod:`fbo_torch.simulate.dp_fts_de`) and this deployment call the same agent
and server functions (:mod:`fbo_torch.federation`); here each SuperNode runs
one agent (``B = 1``) and the ServerApp runs the server of one federation
(``R = 1``). Nothing here imports the simulator.

* :mod:`~fbo_torch.flower.config` — the run config (``[tool.flwr.app.config]``).
* :mod:`~fbo_torch.flower.agent_node` — one agent and its step of a round.
* :mod:`~fbo_torch.flower.coordinator` — the server's side, exchange by exchange:
  secret randomness, every reply checked.
* :mod:`~fbo_torch.flower.server_state` — the server's secret, ledger and rounds on disk.
* :mod:`~fbo_torch.flower.roster` — agents bound to authenticated nodes' keys.
* :mod:`~fbo_torch.flower.identity` — a node's SuperNode key and roster: signed SecAgg+ keys and survivor sets.
* :mod:`~fbo_torch.flower.floor` — the privacy floor each node owns, and ε against a malicious server.
* :mod:`~fbo_torch.flower.records` — messages as Flower records (imports ``flwr``).
* :mod:`~fbo_torch.flower.transport` — pushing an exchange's messages and pulling its replies (imports ``flwr``).
* :mod:`~fbo_torch.flower.secagg` and :mod:`~fbo_torch.flower.secure_round` — SecAgg+, and a secure
  release's round over it (import ``flwr``).
* :mod:`~fbo_torch.flower.server_loop` — the ServerApp's loop: a run's exchanges (imports ``flwr``).
* :mod:`~fbo_torch.flower.server_app` / :mod:`~fbo_torch.flower.client_app` —
  the ``ServerApp`` and ``ClientApp`` (import ``flwr``).

Importing this package does not import ``flwr``: only the modules marked so do.
"""
