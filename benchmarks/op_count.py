r"""Count what a GPU would launch, on any device: tensor operators and host synchronizations.

On a GPU a federation round is launch-bound long before it is compute-bound:
each tensor operator is about one kernel launch of a few microseconds, however
small its tensors (docs/design.md has a GPU profile). :func:`count_ops` runs a function under
``torch.profiler`` and counts, from the operators torch dispatches — the same on
a CPU as on a GPU — the operators that launch a kernel (an operator counts when it is not
kernel-free and no operator below it launches one; the ``add*mm`` family, which copies its
input term and then multiplies, counts itself besides that copy; an approximation: a CPU's
decomposition of an operator is not always a GPU's), how many of those a
CUDA graph replay would replace (calls inside :data:`~fbo_torch.utils.cuda_graphs.GRAPH_REGION`
profiler ranges), and host synchronizations (``.item()``, ``bool()``, ``nonzero``).
With ``FBO_SYNC_FREE=1`` (set here) a CPU runs the GPU's code path: fixed
iteration counts, no early exits.
"""

from __future__ import annotations

import os
from collections.abc import Callable

#: Operators that never launch a kernel (views, allocations, metadata).
NO_KERNEL = frozenset(
    {
        "aten::view",
        "aten::empty",
        "aten::empty_strided",
        "aten::as_strided",
        "aten::reshape",
        "aten::expand",
        "aten::unsqueeze",
        "aten::squeeze",
        "aten::select",
        "aten::slice",
        "aten::t",
        "aten::transpose",
        "aten::permute",
        "aten::detach",
        "aten::alias",
        "aten::resize_",
        "aten::empty_like",
        "aten::lift_fresh",
        "aten::_unsafe_view",
        "aten::numpy_T",
        "aten::mT",
        "aten::matrix_H",
        "aten::unbind",
        "aten::split",
        "aten::chunk",
        "aten::diagonal",
        "aten::narrow",
        "aten::expand_as",
        "aten::view_as",
        "aten::squeeze_",
        "aten::unsqueeze_",
        "aten::result_type",
        "aten::_reshape_alias",
        "aten::is_nonzero_dummy",
        "aten::size",
        "aten::stride",
        "aten::dim",
        "aten::is_floating_point",
        "aten::_has_compatible_shallow_copy_type",
        "aten::_to_copy_dummy",
        "aten::to",
        "aten::contiguous",
        "aten::broadcast_tensors",
        "aten::flatten",
        "aten::movedim",
        "aten::type_as",
        "aten::real",
        "aten::conj",
        "aten::resolve_conj",
        "aten::resolve_neg",
        "aten::as_strided_",
        "aten::t_",
        "aten::transpose_",
        "aten::swapaxes",
        "aten::swapdims",
        "aten::unflatten",
    }
)
#: Matrix products that copy their input term into the output (a child ``copy_``) and then
#: launch their own product kernel with ``beta = 1``: two launches.
ACCUMULATING = frozenset({"aten::addmm", "aten::baddbmm", "aten::addbmm", "aten::addmv", "aten::addr"})
#: Operators that make the host wait for the device.
SYNC_OPS = frozenset({"aten::_local_scalar_dense", "aten::nonzero", "aten::is_nonzero", "aten::item"})


def count_ops(fn: Callable[[], object]) -> dict[str, int]:
    """Leaf operators, estimated kernel launches (eager, and with the CUDA graphs the engine
    uses on a GPU) and host synchronizations of ``fn()``, counted on any device (see the module
    docstring for what counts as a launch)."""
    from torch.profiler import ProfilerActivity, profile

    from fbo_torch.utils.cuda_graphs import GRAPH_REGION

    before = os.environ.get("FBO_SYNC_FREE")
    os.environ["FBO_SYNC_FREE"] = "1"  # count the GPU's code path (a CPU otherwise stops loops early)
    try:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            fn()
    finally:
        if before is None:
            del os.environ["FBO_SYNC_FREE"]
        else:
            os.environ["FBO_SYNC_FREE"] = before
    events = prof.events()
    leaf = [
        e
        for e in events
        if e.name.startswith("aten::") and not any(c.name.startswith("aten::") for c in e.cpu_children)
    ]
    kernels = [e for e in events if _launches(e)]

    def in_graph(e) -> bool:
        p = e.cpu_parent
        while p is not None:
            if p.name.startswith(GRAPH_REGION):
                return True
            p = p.cpu_parent
        return False

    regions = [e for e in events if e.name.startswith(GRAPH_REGION) and not in_graph(e)]
    # a replay: copy each input into the graph's static inputs, one graph launch, clone ~2 outputs
    replay = sum(1 + int(e.name.rsplit("::", 1)[-1]) + 2 for e in regions)
    return {
        "leaf_ops": len(leaf),
        "kernel_ops": len(kernels),
        "kernel_ops_with_graphs": sum(1 for e in kernels if not in_graph(e)) + replay,
        "graph_replays": len(regions),
        "syncs": sum(1 for e in events if e.name in SYNC_OPS),
    }


def _launches(e) -> bool:
    """Whether operator ``e`` launches a kernel itself: an operator that launches none of its own
    (a view, an allocation) or whose work is done by child operators (``matmul`` → ``bmm``) does
    not; an operator whose children are all kernel-free does (``bmm``, whose only children are
    ``resolve_conj`` checks, is one launch)."""
    if not e.name.startswith("aten::") or e.name in NO_KERNEL:
        return False
    return e.name in ACCUMULATING or not any(_launches_below(c) for c in e.cpu_children)


def _launches_below(e) -> bool:
    """Whether ``e`` or an operator below it launches a kernel."""
    if not e.name.startswith("aten::"):
        return False
    return e.name not in NO_KERNEL or any(_launches_below(c) for c in e.cpu_children)


__all__ = ["ACCUMULATING", "NO_KERNEL", "SYNC_OPS", "count_ops"]
