r"""The federation report: self-contained HTML pages of a run (:mod:`~fbo_torch.report.page`) and of a
Flower deployment (:mod:`~fbo_torch.report.flower`). Imports nothing of the simulator or the experiments,
so a Flower ServerApp can write its page."""
