r"""Replay fixed-shape tensor programs as CUDA graphs.

A round's heavy phases — maximizing every agent's Thompson sample, maximizing
the broadcast, refitting every agent's GP — are iterative (a batched BFGS of
tens of steps) over tensors whose shapes do not change from round to round.
Launched op by op, each costs thousands of small kernel launches, and on a GPU
the launches, not the arithmetic, set the time. Captured once as a CUDA graph
and replayed, each phase is one launch.

:class:`GraphCache` captures a *pure* function of tensors (no host
synchronization, no data-dependent shapes, randomness only from keyed streams
— everything in :mod:`fbo_torch.federation.agents`' hot path is written so)
once per input signature, and replays it:

* the first call of a signature runs the function eagerly twice on a side
  stream (warm-up: caches, allocator), captures it, replays the graph and
  **compares the replay with the eager result**; any exception during capture
  or a mismatch (beyond float round-off) disables graphs for that signature,
  with a warning, and the eager result is used — a graph can only make a
  call faster, never different;
* later calls copy the new inputs into the graph's static inputs and replay.

Graphs are used only for CUDA tensors and can be switched off with the
environment variable ``FBO_CUDA_GRAPHS=0``. On a CPU the function simply runs.
"""

from __future__ import annotations

import os
import warnings
from collections import OrderedDict
from collections.abc import Callable, Hashable

import torch
from torch import Tensor

#: Prefix of the profiler range around an eager call that a CUDA graph would replay.
GRAPH_REGION = "fbo_graph::"


def graphs_enabled(tensors: tuple[Tensor, ...]) -> bool:
    """Whether calls on ``tensors`` are captured (CUDA, not disabled, not already capturing)."""
    if os.environ.get("FBO_CUDA_GRAPHS", "1") == "0":
        return False
    if not tensors or not all(isinstance(t, Tensor) and t.is_cuda for t in tensors):
        return False
    return not torch.cuda.is_current_stream_capturing()


def _signature(tensors: tuple[Tensor, ...]) -> tuple[tuple[tuple[int, ...], torch.dtype, torch.device], ...]:
    return tuple((tuple(t.shape), t.dtype, t.device) for t in tensors)


def _same(a: tuple[Tensor, ...], b: tuple[Tensor, ...]) -> bool:
    for x, y in zip(a, b, strict=True):
        if x.shape != y.shape or x.dtype != y.dtype:
            return False
        if x.is_floating_point():
            # replay and eager run the same kernels; allow reassociation-level differences only
            tol = 1e-9 if x.dtype == torch.float64 else 1e-4
            if not torch.allclose(x, y, rtol=tol, atol=tol, equal_nan=True):
                return False
        elif not torch.equal(x, y):
            return False
    return True


class _Entry:
    def __init__(
        self, graph: torch.cuda.CUDAGraph, static_in: tuple[Tensor, ...], static_out: tuple[Tensor, ...]
    ) -> None:
        self.graph, self.static_in, self.static_out = graph, static_in, static_out


class GraphCache:
    r"""Capture-and-replay of one pure tensor function, one CUDA graph per input signature.

    Args:
        name: Shown in warnings.
        max_graphs: Graphs kept (least recently used dropped first; each holds its memory pool).
    """

    def __init__(self, name: str, max_graphs: int = 8) -> None:
        self.name, self.max_graphs = name, max_graphs
        self._graphs: OrderedDict[Hashable, _Entry] = OrderedDict()
        self._failed: set[Hashable] = set()

    def __call__(
        self, fn: Callable[..., tuple[Tensor, ...]], tensors: tuple[Tensor, ...], key: Hashable = ()
    ) -> tuple[Tensor, ...]:
        r"""``fn(*tensors)``, replayed from a CUDA graph when possible.

        ``fn`` must return a tuple of tensors and depend only on ``tensors``
        and on what ``key`` describes (Python settings baked into the graph).
        """
        if not graphs_enabled(tensors):
            # marked for profilers: benchmarks/round_time.py --ops counts what a CUDA graph would replace
            with torch.profiler.record_function(f"{GRAPH_REGION}{self.name}::{len(tensors)}"):
                return fn(*tensors)
        full_key = (key, _signature(tensors))
        if full_key in self._failed:
            return fn(*tensors)
        entry = self._graphs.get(full_key)
        if entry is None:
            return self._capture(fn, tensors, full_key)
        self._graphs.move_to_end(full_key)
        for s, t in zip(entry.static_in, tensors, strict=True):
            s.copy_(t)
        entry.graph.replay()
        return tuple(o.clone() for o in entry.static_out)

    def _capture(
        self, fn: Callable[..., tuple[Tensor, ...]], tensors: tuple[Tensor, ...], full_key: Hashable
    ) -> tuple[Tensor, ...]:
        static_in = tuple(t.clone() for t in tensors)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        try:
            with torch.cuda.stream(side):
                for _ in range(2):
                    eager = fn(*static_in)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                static_out = fn(*static_in)
            graph.replay()
            if not _same(tuple(static_out), tuple(eager)):
                raise RuntimeError("the replayed graph differs from the eager computation")
        except Exception as err:
            torch.cuda.current_stream().wait_stream(side)
            self._failed.add(full_key)
            warnings.warn(
                f"CUDA graph capture of {self.name} disabled for this input shape ({err}); running eagerly.",
                RuntimeWarning,
                stacklevel=3,
            )
            return fn(*tensors)
        self._graphs[full_key] = _Entry(graph, static_in, tuple(static_out))
        while len(self._graphs) > self.max_graphs:
            self._graphs.popitem(last=False)
        return tuple(o.clone() for o in static_out)
