r"""Bridges to other optimization frameworks, each behind an optional extra.

* :mod:`~fbo_torch.integrations.ax` — federated Thompson sampling as a
  generation step of `Ax <https://ax.dev>`_ experiments (extra ``fbo_torch[ax]``).
  Its parts: :mod:`~fbo_torch.integrations.ax_unit_cube` (the search space as a
  unit cube), :mod:`~fbo_torch.integrations.ax_messages` (an agent's data and
  message), :mod:`~fbo_torch.integrations.ax_node` (the generation node).

Importing this package imports none of them; each module imports its framework
when it is imported itself.
"""
