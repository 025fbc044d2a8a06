r"""One round of CNN hyperparameter trainings: batched (one stacked model) vs one model at a time.

The DP-FTS-DE EMNIST task trains, per round, ``K`` configurations of the
objective's :class:`~fbo_torch.objectives.cnn.SmallCNN` (50 agents x 5
repetitions = 250 in the paper's setting). This script times a round for
``K ∈ {1, 10, 50, 250}`` at EMNIST shape (28 x 28 x 1 images, 10 classes,
channels (16, 32), and :class:`~fbo_torch.objectives.vision.EMNISTCNN`'s
default SGD steps and batch size), three ways:

* ``plain`` — :func:`~fbo_torch.objectives.cnn.train_cnn_single`, an ordinary
  PyTorch loop, once per configuration (timed for ``min(K, --plain-max)``
  configurations and extrapolated linearly to ``K``; the JSON says which);
* ``batched`` — :func:`~fbo_torch.objectives.cnn.train_cnn_batched` with the
  default :class:`~fbo_torch.objectives.cnn.TrainerOptions` (float32, TF32 off,
  CUDA graphs on CUDA);
* ``batched_bf16`` (CUDA only) — the same with bf16 autocast and TF32.

The data are **random tensors** of the right shape (uniform pixels, random
labels; each configuration gets 160 training and 40 validation images of a
pool of 10,000): the time of a training run does not depend on the pixel values.

Reported per cell: wall time of the round (median of ``--repeats`` after one
untimed warm-up run of the same cell, which includes cuDNN autotuning and CUDA
graph capture only in the warm-up), configurations trained per second, and
peak memory (CUDA: ``torch.cuda.max_memory_allocated`` of that run; CPU: the
max RSS of the process, one process per ``K`` in which ``plain`` runs first, so
the batched figure is the larger of the two). The goals of issue 16 on an H100
are printed against the measurement: a round of 250 configurations costs at
most 2 plain single-configuration trainings, and batched ``K = 1`` is no slower
than the plain loop.

Usage::

    python benchmarks/cnn_training.py                  # CPU, K in {1, 10} (larger K take minutes per cell)
    python benchmarks/cnn_training.py --device cuda    # CUDA, K in {1, 10, 50, 250}
    python benchmarks/cnn_training.py --quick          # seconds; used by the tests
"""

from __future__ import annotations

import argparse
import inspect
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from round_time import machine_info  # sibling script: benchmarks/ is sys.path[0] when run

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = Path(__file__).resolve()
MODES = ("plain", "batched", "batched_bf16")
POOL, N_TRAIN, N_VAL = 10_000, 160, 40


def objective_defaults() -> dict:
    """Steps and batch size of :class:`EMNISTCNN` (the EMNIST task's training runs)."""
    from fbo_torch.objectives.vision import EMNISTCNN

    params = inspect.signature(EMNISTCNN.__init__).parameters
    return {
        "steps": params["steps"].default,
        "batch_size": params["batch_size"].default,
        "channels": list(params["channels"].default),
    }


# ---------------------------------------------------------------------- cell
def run_cell(
    K: int,
    device: str,
    steps: int,
    batch_size: int,
    channels: list[int],
    repeats: int,
    plain_max: int,
    modes: list[str],
    threads: int,
) -> list[dict]:
    """Time one round of ``K`` trainings in each mode, in this process."""
    import torch

    from fbo_torch.objectives.cnn import (
        SmallCNN,
        TrainerOptions,
        cuda_backend_flags,
        train_cnn_batched,
        train_cnn_single,
    )

    torch.set_num_threads(threads)
    dev = torch.device(device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    gen = torch.Generator().manual_seed(0)
    images = torch.rand(POOL, 1, 28, 28, generator=gen).to(dev)
    labels = torch.randint(10, (POOL,), generator=gen).to(dev)
    perms = [torch.randperm(POOL, generator=gen)[: N_TRAIN + N_VAL] for _ in range(K)]
    tr, va = [p[:N_TRAIN] for p in perms], [p[N_TRAIN:] for p in perms]
    lr = (10 ** torch.empty(K).uniform_(-4, -1.7, generator=gen)).tolist()
    decay = (10 ** torch.empty(K).uniform_(-7, -1.7, generator=gen)).tolist()
    l2 = (10 ** torch.empty(K).uniform_(-7, -1.7, generator=gen)).tolist()
    net = SmallCNN(image_size=28, channels=channels)
    base = TrainerOptions()

    def plain(n: int):
        with cuda_backend_flags(dev, base):  # same TF32/cuDNN policy as the batched default
            for k in range(n):
                train_cnn_single(
                    net,
                    images,
                    labels,
                    tr[k],
                    va[k],
                    lr[k],
                    decay[k],
                    l2[k],
                    seed=k,
                    steps=steps,
                    batch_size=batch_size,
                )

    def batched(options):
        acc = train_cnn_batched(
            net,
            images,
            labels,
            tr,
            va,
            lr,
            decay,
            l2,
            list(range(K)),
            steps=steps,
            batch_size=batch_size,
            options=options,
        )
        acc.sum().item()  # wait for the result, as a caller would

    runners = {
        "plain": lambda: plain(min(K, plain_max)),
        "batched": lambda: batched(base),
        "batched_bf16": lambda: batched(TrainerOptions(autocast_dtype=torch.bfloat16, allow_tf32=True)),
    }
    rows = []
    for mode in modes:
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats(dev)
        runners[mode]()  # warm-up (cuDNN autotuning, graph capture, allocator)
        times = []
        for _ in range(repeats):
            sync()
            t0 = time.perf_counter()
            runners[mode]()
            sync()
            times.append(time.perf_counter() - t0)
        wall = statistics.median(times)
        timed = min(K, plain_max) if mode == "plain" else K
        round_s = wall * K / timed
        peak = (
            torch.cuda.max_memory_allocated(dev)
            if dev.type == "cuda"
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        )
        rows.append(
            {
                "K": K,
                "mode": mode,
                "device": device,
                "round_s": round_s,
                "configs_per_s": K / round_s,
                "timed_configs": timed,
                "extrapolated": timed < K,
                "repeats_s": times,
                "peak_memory_bytes": int(peak),
                "peak_memory_kind": "cuda_max_memory_allocated" if dev.type == "cuda" else "process_max_rss",
            }
        )
        print(
            f"  K={K:4d} {mode:13s} round {round_s:9.3f} s  {K / round_s:8.2f} configs/s"
            f"{f'  (extrapolated from {timed})' if timed < K else ''}  peak {peak / 2**20:8.1f} MiB",
            flush=True,
        )
    return rows


# ---------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    p.add_argument(
        "--K",
        type=int,
        nargs="+",
        help="configurations per round (default: 1 10 50 250 on CUDA, 1 10 on CPU, 1 2 with --quick)",
    )
    p.add_argument("--steps", type=int, help="SGD steps per training (default: EMNISTCNN's)")
    p.add_argument("--batch-size", type=int, help="minibatch size (default: EMNISTCNN's)")
    p.add_argument("--repeats", type=int, help="timed runs per cell after a warm-up (default 3 CUDA, 1 CPU)")
    p.add_argument(
        "--plain-max",
        type=int,
        default=3,
        help="plain loop: time this many configurations and extrapolate to K (default 3)",
    )
    p.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's choice)")
    p.add_argument("--quick", action="store_true", help="tiny run (K 1 2, 4 steps) to check the script")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results", help="output folder")
    p.add_argument("--cell", type=int, help=argparse.SUPPRESS)  # internal: run one K in this process
    args = p.parse_args(argv)

    if args.device not in ("cpu", "cuda"):
        p.error(f"--device must be cpu or cuda, got {args.device!r}")
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device is available on this machine")
    defaults = objective_defaults()
    steps = args.steps or (4 if args.quick else defaults["steps"])
    batch = args.batch_size or defaults["batch_size"]
    repeats = args.repeats or (3 if args.device == "cuda" and not args.quick else 1)
    Ks = args.K or ([1, 2] if args.quick else [1, 10, 50, 250] if args.device == "cuda" else [1, 10])
    if min(Ks) < 1 or steps < 1 or batch < 1 or repeats < 1 or args.plain_max < 1:
        p.error("--K, --steps, --batch-size, --repeats and --plain-max must be positive")
    modes = ["plain", "batched"] + (["batched_bf16"] if args.device == "cuda" else [])
    threads = args.threads or torch.get_num_threads()

    if args.cell is not None:
        rows = run_cell(
            args.cell, args.device, steps, batch, defaults["channels"], repeats, args.plain_max, modes, threads
        )
        print("CELL " + json.dumps(rows))
        return 0

    print(
        f"CNN training round on {args.device}: 28x28x1 random images, SmallCNN{tuple(defaults['channels'])}, "
        f"{steps} steps, batch {batch}, K = {Ks}",
        flush=True,
    )
    cells = []
    for K in Ks:  # one process per K: its own peak memory
        cmd = [
            sys.executable,
            str(SCRIPT),
            "--cell",
            str(K),
            "--device",
            args.device,
            "--steps",
            str(steps),
            "--batch-size",
            str(batch),
            "--repeats",
            str(repeats),
            "--plain-max",
            str(args.plain_max),
            "--threads",
            str(threads),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        out = [line for line in proc.stdout.splitlines() if not line.startswith("CELL ")]
        print("\n".join(out), flush=True)
        if proc.returncode != 0:
            print(proc.stderr[-3000:], file=sys.stderr)
            return proc.returncode
        cells += json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("CELL "))[5:])

    plain1 = next(c["round_s"] / c["K"] for c in cells if c["mode"] == "plain")  # one plain training
    for c in cells:
        c["plain_trainings_per_round"] = c["round_s"] / plain1
    summary = {}
    for mode in modes[1:]:
        by_k = {c["K"]: c for c in cells if c["mode"] == mode}
        if 250 in by_k:
            summary[f"{mode}_K250_in_plain_trainings"] = by_k[250]["plain_trainings_per_round"]
        if 1 in by_k:
            summary[f"{mode}_K1_over_plain"] = by_k[1]["plain_trainings_per_round"]
    result = {
        "settings": {
            "device": args.device,
            "K": Ks,
            "steps": steps,
            "batch_size": batch,
            "repeats": repeats,
            "plain_max": args.plain_max,
            "image": [1, 28, 28],
            "num_classes": 10,
            "channels": defaults["channels"],
            "train_per_config": N_TRAIN,
            "val_per_config": N_VAL,
            "pool": POOL,
            "data": "random tensors (uniform pixels, random labels)",
            "quick": args.quick,
            "threads": threads,
        },
        "machine": machine_info(args.device),
        "goals": {"K250_round_at_most_plain_trainings": 2.0, "K1_batched_over_plain_at_most": 1.0},
        "summary": summary,
        "cells": cells,
    }
    for key, value in summary.items():
        print(f"{key}: {value:.2f}")
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"cnn_training_{args.device}" + ("_quick" if args.quick else "")
    (args.out / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(result, args.out / f"{stem}.png")
    print(f"wrote {args.out / (stem + '.json')} and .png")
    return 0


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = result["settings"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    styles = {
        "plain": ("tab:gray", "o", "--"),
        "batched": ("tab:blue", "s", "-"),
        "batched_bf16": ("tab:orange", "^", "-"),
    }
    for mode, (color, marker, ls) in styles.items():
        cells = sorted((c for c in result["cells"] if c["mode"] == mode), key=lambda c: c["K"])
        if not cells:
            continue
        K = [c["K"] for c in cells]
        axes[0].plot(K, [c["configs_per_s"] for c in cells], color=color, marker=marker, ls=ls, label=mode)
        axes[1].plot(K, [c["plain_trainings_per_round"] for c in cells], color=color, marker=marker, ls=ls, label=mode)
    axes[1].axhline(2.0, color="k", lw=0.8, ls=":", label="goal at K = 250 (2 plain trainings)")
    axes[0].set(
        xscale="log", yscale="log", xlabel="configurations per round K", ylabel="configurations / s", title="throughput"
    )
    axes[1].set(
        xscale="log",
        yscale="log",
        xlabel="configurations per round K",
        ylabel="round time / one plain training",
        title="round cost",
    )
    for ax in axes:
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(
        f"SmallCNN on 28x28x1 random tensors, {s['steps']} SGD steps, batch {s['batch_size']}, "
        f"{result['machine'].get('gpu', result['machine']['cpu'])} "
        f"(median of {s['repeats']} after a warm-up)",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
