"""The simulator's runners: FTS (:mod:`~fbo_torch.simulate.fts`) and DP-FTS-DE
(:mod:`~fbo_torch.simulate.dp_fts_de`) over many agents and repetitions as batched tensors, and the
named setups of the agents (:mod:`~fbo_torch.simulate.presets`)."""
