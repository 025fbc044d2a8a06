"""YAML experiments: the configuration (:mod:`~fbo_torch.experiments.config`), the loop over scenarios,
methods and repetitions (:mod:`~fbo_torch.experiments.loop`), its checkpoints, output folder and reports."""
