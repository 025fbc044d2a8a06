r"""Central vs secure aggregation with distributed noise: utility at matched ε, and SecAgg+'s cost per round.

``utility`` — on the synthetic federation (DP-FTS-DE Sec. 5.1, smaller: N = 50
agents on a 500-point grid, 20 rounds, P = 2, q = 0.25, S = 11, z = 1) and on
landmine (N = 29 fields, 30 rounds, P = 4, q = 0.35, S = 22, z = 2), three arms
run with the same seed, so repetition ``r`` starts every arm from the same
initial points and the server draws the same Poisson coins:

* ``central`` — the papers' mechanism (Opacus RDP accountant, ε with amplification);
* ``secure, same z`` — secure aggregation with the same noise multiplier: the
  same noise scale, so the difference is what rounding to the lattice and
  discrete noise cost;
* ``secure, matched ε`` — the noise multiplier whose ε against other agents and
  outsiders (``k − 1`` shares, amplified by the hidden sample, Zhu & Wang's
  bound) equals the central ε: the difference is what the distributed trust
  model costs at equal protection against everyone but the server — which, in
  the secure arms, is also protected (``epsilon_server``: no amplification).

Reported per arm: the final agent-averaged loss (mean ± s.e. over repetitions),
the paired difference to ``central`` (mean ± s.e., two-sided t-test), both ε,
and the released noise norm. δ = 1e-5.

``overhead`` — SecAgg+'s time and bytes per round for N = 4 … 64 nodes: in one
process (every node's cryptography done in turn: the compute cost in CPU
seconds; Flower's messages serialized for the bytes), with every pair (SecAgg) and with a ring of
``2⌈log₂ N⌉ + 1`` neighbours (SecAgg+); and on 127.0.0.1 through
``examples/flower_app/run_demo.sh`` (a SuperLink and N SuperNodes with TLS and
node authentication) as far as ``--loopback`` lists.

``plot`` — seconds per round and bytes per node per round against N from any ``overhead`` JSON
files: the loopback runs (SecAgg+'s part of each secure round; a whole central round; a run that did
not finish marked at its N) and the in-process cryptography (CPU seconds, every pair and the ring).

Usage::

    nice -n 10 python benchmarks/secure_aggregation.py utility --reps 20      # ~30-40 min on 2 cores
    python benchmarks/secure_aggregation.py overhead --loopback 4 8 16
    python benchmarks/secure_aggregation.py utility --quick                    # seconds
    python benchmarks/secure_aggregation.py plot OUT.png benchmarks/results/secure_aggregation/overhead*.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
OUT = ROOT / "benchmarks" / "results" / "secure_aggregation"
DELTA = 1e-5

OBJECTIVES = {
    "synthetic": dict(
        objective=dict(
            type="gp_grid",
            num_groups=1,
            agents_per_group=50,
            perturbation=0.02,
            perturb_first=True,
            grid_size=500,
            lengthscale=0.03,
            noise_variance=0.01,
        ),
        settings=dict(
            num_iterations=20,
            num_init=10,
            num_features=50,
            rff_lengthscale=0.03,
            rff_noise_variance=0.01,
            p_t="1-1/sqrt(t)",
            num_regions=2,
            sample_rate=0.25,
            clip_norm=11.0,
            noise_multiplier=1.0,
        ),
    ),
    "landmine": dict(
        objective=dict(type="landmine"),
        settings=dict(
            num_iterations=30,
            num_init=10,
            num_features=100,
            rff_lengthscale=0.01,
            rff_noise_variance=1e-6,
            p_t="1-1/t",
            const_rounds=10,
            decay_rounds=30,
            num_regions=4,
            sample_rate=0.35,
            clip_norm=22.0,
            noise_multiplier=2.0,
        ),
    ),
}
QUICK = dict(
    objective=dict(
        type="gp_grid", num_groups=1, agents_per_group=6, grid_size=100, perturbation=0.05, perturb_first=True
    ),
    settings=dict(
        num_iterations=3,
        num_init=2,
        num_features=10,
        num_regions=2,
        sample_rate=0.5,
        clip_norm=1.0,
        noise_multiplier=1.0,
        gp_sample_features=16,
        gp_fit_maxiter=5,
    ),
)


def meta() -> dict:
    """Machine, versions and command of a study (recorded in its JSON)."""
    import platform

    import flwr
    import opacus
    import torch

    cpu = (
        next(
            (
                line.split(":", 1)[1].strip()
                for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")
            ),
            platform.processor(),
        )
        if Path("/proc/cpuinfo").exists()
        else platform.processor()
    )
    return {
        "machine": f"{cpu}, {os.cpu_count()} cores",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "flwr": flwr.__version__,
        "opacus": opacus.__version__,
        "command": "python benchmarks/secure_aggregation.py " + " ".join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d"),
    }


# --------------------------------------------------------------------------- ε of a configuration
def central_epsilon(settings: dict, rounds: int) -> float:
    from fbo_torch.privacy import compute_epsilon

    return compute_epsilon(settings["sample_rate"], settings["noise_multiplier"], rounds, DELTA, accountant="rdp")


def secure_epsilons(settings: dict, num_agents: int, rounds: int) -> tuple[float, float]:
    """Final (ε against others, ε against the server) of ``rounds`` secure releases of all ``N`` agents."""
    from fbo_torch.federation.secure import SecureMechanism
    from fbo_torch.federation.settings import DPFTSDESettings
    from fbo_torch.privacy import DistributedDiscreteGaussianAccountant, get_epsilon

    mech = SecureMechanism.from_settings(DPFTSDESettings(aggregation="secure", **settings), num_agents)
    acc = DistributedDiscreteGaussianAccountant(mech.ddg_constants())
    others = get_epsilon(
        acc, DELTA, history=[(mech.noise_multiplier_of(num_agents - 1), settings["sample_rate"], rounds)]
    )
    server = get_epsilon(acc, DELTA, history=[(mech.noise_multiplier_of(num_agents), 1.0, rounds)])
    return others, server


def matched_noise(settings: dict, num_agents: int, rounds: int, target: float) -> float:
    """The noise multiplier whose secure ε against others equals ``target`` (to 1e-4 relative)."""
    from scipy.optimize import brentq

    def gap(log_z: float) -> float:
        return math.log(
            secure_epsilons({**settings, "noise_multiplier": math.exp(log_z)}, num_agents, rounds)[0] / target
        )

    z = settings["noise_multiplier"]
    lo, hi = math.log(z / 4), math.log(z * 4)
    return math.exp(brentq(gap, lo, hi, xtol=1e-5))


# --------------------------------------------------------------------------- utility
def run_arm(spec: dict, aggregation: str, z: float, reps: int, seed: int) -> dict:
    import torch

    from fbo_torch.federation.settings import DPFTSDESettings
    from fbo_torch.objectives import build_objective
    from fbo_torch.simulate.dp_fts_de import DPFTSDERunner

    torch.set_num_threads(1)
    objective = build_objective(dict(spec["objective"]))
    settings = DPFTSDESettings(aggregation=aggregation, **{**spec["settings"], "noise_multiplier": z})
    runner = DPFTSDERunner(objective, settings, reps, seed=seed, delta=DELTA, name=aggregation)
    t0 = time.perf_counter()
    res = runner.run()
    N = objective.num_agents
    per_rep = res.loss.view(reps, N, -1).mean(1)
    noise = [sum(r) / len(r) for r in res.noise_norm]
    out = {
        "aggregation": aggregation,
        "noise_multiplier": z,
        "reps": reps,
        "num_agents": N,
        "per_rep_curves": per_rep.tolist(),
        "epsilon": res.epsilon[-1],
        "accountant": res.accountant,
        "epsilon_server": None if res.epsilon_server is None else res.epsilon_server[-1],
        "noise_norm_mean": sum(noise) / len(noise),
        "wall_time_s": time.perf_counter() - t0,
    }
    if runner.server.secure:
        m = runner.server.mechanism
        out["mechanism"] = {
            "scale": m.scale,
            "local_variance": m.local_variance,
            "modulus_bits": m.bits,
            "l2_sensitivity": m.l2_sensitivity,
            "dim": m.dim,
            "rounding_inflation": m.l2_sensitivity / m.scale - 1,
        }
    return out


def utility(args) -> dict:
    from paired_stats import paired_difference

    specs = {"quick": QUICK} if args.quick else {k: OBJECTIVES[k] for k in args.objectives}
    reps = 2 if args.quick else args.reps
    path = Path(args.out) / ("utility_quick.json" if args.quick else "utility.json")
    done = json.loads(path.read_text()) if path.exists() and args.resume else {"objectives": {}}
    done.setdefault("meta", meta())
    for name, spec in specs.items():
        entry = done["objectives"].setdefault(name, {"arms": {}})
        N = _num_agents(spec)
        s, T = spec["settings"], spec["settings"]["num_iterations"]
        eps_c = central_epsilon(s, T)
        z_match = matched_noise(s, N, T, eps_c)
        entry.update(
            settings=s,
            objective=spec["objective"],
            delta=DELTA,
            central_epsilon=eps_c,
            matched_noise_multiplier=z_match,
            secure_epsilons_same_z=secure_epsilons(s, N, T),
            secure_epsilons_matched=secure_epsilons({**s, "noise_multiplier": z_match}, N, T),
        )
        arms = {
            "central": ("central", s["noise_multiplier"]),
            "secure, same z": ("secure", s["noise_multiplier"]),
            "secure, matched ε": ("secure", z_match),
        }
        for label, (agg, z) in arms.items():
            if label in entry["arms"]:
                continue
            print(f"{name}: {label} (z = {z:.4f}) ...", file=sys.stderr, flush=True)
            entry["arms"][label] = run_arm(spec, agg, z, reps, args.seed)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(done, indent=1))
        base = [c[-1] for c in entry["arms"]["central"]["per_rep_curves"]]
        entry["summary"] = {}
        for label, arm in entry["arms"].items():
            final = [c[-1] for c in arm["per_rep_curves"]]
            n = len(final)
            mean = sum(final) / n
            se = (sum((x - mean) ** 2 for x in final) / (n - 1) / n) ** 0.5
            entry["summary"][label] = {
                "final_loss_mean": mean,
                "final_loss_se": se,
                "epsilon": arm["epsilon"],
                "epsilon_server": arm["epsilon_server"],
                "noise_norm_mean": arm["noise_norm_mean"],
                "paired_vs_central": paired_difference([a - b for a, b in zip(final, base, strict=False)]),
            }
        path.write_text(json.dumps(done, indent=1))
    print(table(done))
    return done


def _num_agents(spec: dict) -> int:
    from fbo_torch.objectives import build_objective

    return build_objective(dict(spec["objective"])).num_agents


def table(done: dict) -> str:
    lines = [
        "| objective | arm | z | final loss (mean ± s.e.) | vs central (paired) | ε others / server | noise norm |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, entry in done["objectives"].items():
        for label, row in entry.get("summary", {}).items():
            arm = entry["arms"][label]
            d = row["paired_vs_central"]
            eps = f"{row['epsilon']:.2f}" + ("" if row["epsilon_server"] is None else f" / {row['epsilon_server']:.2f}")
            diff = (
                "—"
                if label == "central"
                else f"{d['diff']:+.4f} ± {d['se']:.4f}" + (" (distinguishable)" if d["distinguishable"] else "")
            )
            lines.append(
                f"| {name} | {label} | {arm['noise_multiplier']:.3f} | {row['final_loss_mean']:.4f} ± "
                f"{row['final_loss_se']:.4f} | {diff} | {eps} | {row['noise_norm_mean']:.3f} |"
            )
    return "\n".join(lines)


# --------------------------------------------------------------------------- overhead
def _identities(N: int) -> dict:
    """Node ``100 + n``'s identity (agent ``n``'s SuperNode key, and a roster of all ``N`` keys)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    from fbo_torch.flower.identity import NodeIdentity
    from fbo_torch.flower.roster import AgentRoster

    keys = [ec.generate_private_key(ec.SECP384R1()) for _ in range(N)]
    pem = serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    roster = AgentRoster({n: k.public_key().public_bytes(*pem) for n, k in enumerate(keys)}, N)
    return {100 + n: NodeIdentity(k, roster, n) for n, k in enumerate(keys)}


def in_process_round(N: int, num_shares: int, dim: int, modulus: int, signed: bool = True) -> dict:
    """One SecAgg+ round over ``N`` nodes in this process: CPU seconds of the server and of all nodes, bytes.

    With ``signed`` every node signs its keys and its survivor set and checks the others' (a malicious server's
    protocol, as deployed); without, the consistency stage carries empty signatures (a trusted server)."""
    import numpy as np
    from flwr.app import ConfigRecord, RecordDict

    from fbo_torch.flower.config import default_threshold
    from fbo_torch.flower.records import payload_bytes
    from fbo_torch.flower.secagg import SecAggClient, SecAggServer
    from fbo_torch.flower.secagg_records import secagg_reply, secagg_request

    rng = np.random.default_rng(0)
    vecs = {100 + i: rng.integers(-1000, 1000, dim) for i in range(N)}
    ids = _identities(N) if signed else {}
    t_node = t_server = 0.0
    sent = received = 0

    def timed(fn, *a, **kw):  # CPU seconds of this process: steadier than wall time on a shared machine
        t0 = time.process_time()
        out = fn(*a, **kw)
        return out, time.process_time() - t0

    k = min(num_shares, N) + (1 if num_shares < N and num_shares % 2 == 0 else 0)
    threshold = default_threshold(k, N, N)
    clients = {}
    for nid, v in vecs.items():
        clients[nid], dt = timed(
            SecAggClient.setup,
            nid,
            1,
            modulus,
            v,
            agent_id=nid - 100,
            federation="benchmark",
            min_threshold=threshold,
            num_agents=N,
            identity=ids.get(nid),
        )
        t_node += dt
    received += sum(
        payload_bytes(RecordDict({"fbo.secagg": ConfigRecord({"pk1": c.pk1, "pk2": c.pk2, "signature": c.signature})}))
        for c in clients.values()
    )
    (server, dt) = timed(
        SecAggServer,
        1,
        {i: (c.pk1, c.pk2) for i, c in clients.items()},
        dim,
        modulus,
        k,
        threshold,
        agents={i: i - 100 for i in clients},
        signatures={i: c.signature for i, c in clients.items()},
    )
    t_server += dt
    (req, _), dt = timed(server.share_keys_requests)
    t_server += dt
    replies = {}
    for nid, keys in req.items():
        sent += payload_bytes(secagg_request(1, **server.share_keys_content(nid)))
        replies[nid], dt = timed(
            clients[nid].share_keys, 1, keys, server.threshold, server.agents, server.signatures, ids.get(nid)
        )
        t_node += dt
        received += payload_bytes(
            secagg_reply(destinations=replies[nid][0], ciphertexts=replies[nid][1], commitment=replies[nid][2])
        )
    _, dt = timed(server.receive_shares, replies)
    t_server += dt
    req, dt = timed(server.masked_vector_requests)
    t_server += dt
    masked = {}
    for nid, (src, cts) in req.items():
        sent += payload_bytes(secagg_request(1, sources=src, ciphertexts=cts))
        masked[nid], dt = timed(clients[nid].masked_vector, 1, src, cts)
        t_node += dt
        received += payload_bytes(secagg_reply(masked=masked[nid].astype("<i8").tobytes()))
    _, dt = timed(server.receive_masked, masked)
    t_server += dt
    signed_sets = {}
    for nid, surv in server.consistency_requests().items():
        sent += payload_bytes(secagg_request(1, survivors=surv))
        signed_sets[nid], dt = timed(clients[nid].consistency, 1, surv, ids.get(nid))
        t_node += dt
        received += payload_bytes(secagg_reply(signature=signed_sets[nid]))
    _, dt = timed(server.receive_consistency, signed_sets)
    t_server += dt
    replies = {}
    for nid, signatures in server.unmask_requests().items():
        sent += payload_bytes(
            secagg_request(
                1,
                signers=list(signatures),
                **{"signer-agents": [a for a, _ in signatures.values()]},
                signatures=[s for _, s in signatures.values()],
            )
        )
        replies[nid], dt = timed(clients[nid].unmask, 1, signatures, ids.get(nid))
        t_node += dt
        received += payload_bytes(secagg_reply(**{"node-ids": replies[nid][0], "shares": replies[nid][1]}))
    total, dt = timed(server.unmask, replies)
    t_server += dt
    assert np.array_equal(total, np.remainder(sum(vecs.values()), modulus))
    return {
        "N": N,
        "num_shares": server.num_shares,
        "threshold": server.threshold,
        "signed": signed,
        "server_s": t_server,
        "nodes_s_total": t_node,
        "node_s_mean": t_node / N,
        "bytes_sent": sent,
        "bytes_received": received,
    }


def loopback_round(N: int, secagg: bool, rounds: int) -> dict:
    """A secured Flower run on 127.0.0.1 (examples/flower_app/run_demo.sh): per-round SecAgg+ seconds and bytes."""
    env = dict(
        os.environ,
        NUM_NODES=str(N),
        ROUNDS=str(rounds),
        KEEP="1",
        PORT=str(9500 + 2 * N),
        DEMO_TIMEOUT=str(120 * rounds + 30 * N),
        PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    )
    env.setdefault("VENV", sys.prefix)  # this interpreter's virtual environment
    if secagg:
        env["SECAGG"] = "1"
    t0 = time.perf_counter()
    proc = subprocess.run(
        [str(ROOT / "examples" / "flower_app" / "run_demo.sh")], capture_output=True, text=True, env=env, cwd=ROOT
    )
    wall = time.perf_counter() - t0
    work = re.search(r"logs in (\S+)", proc.stdout + proc.stderr)
    out = {"N": N, "secagg": secagg, "rounds": rounds, "returncode": proc.returncode, "wall_s": wall}
    if work and (Path(work.group(1)) / "summary.json").exists():
        summary = json.loads((Path(work.group(1)) / "summary.json").read_text())
        out["rounds_log"] = [
            {k: r.get(k) for k in ("round", "released", "num_reported", "secagg")} for r in summary["rounds"]
        ]
        phases = (Path(work.group(1)) / "phases").read_text().split()
        out["phases"] = dict(zip(phases[::2], map(float, phases[1::2]), strict=False))
    if proc.returncode:
        out["error"] = (proc.stdout + proc.stderr)[-1500:]  # its logs are kept where the message says
    elif work:
        shutil.rmtree(work.group(1), ignore_errors=True)  # the demo's temporary folder (KEEP=1 kept it for us)
    return out


def overhead(args) -> dict:
    from fbo_torch.federation.secure import SecureMechanism
    from fbo_torch.federation.settings import DPFTSDESettings

    path = Path(args.out) / "overhead.json"
    data = json.loads(path.read_text()) if path.exists() and args.resume else {"in_process": [], "loopback": []}
    data.setdefault("meta", []).append(meta())  # one entry per invocation (a study may be resumed)
    for N in args.nodes:
        s = DPFTSDESettings(
            aggregation="secure", num_regions=2, num_features=50, sample_rate=0.75, noise_multiplier=1.0, clip_norm=1.0
        )
        mech = SecureMechanism.from_settings(s, N)
        for k in sorted({N, 2 * math.ceil(math.log2(N)) + 1}):
            if any(r["N"] == N and r["num_shares"] == min(k, N) and r.get("signed") for r in data["in_process"]):
                continue
            row = in_process_round(N, k, mech.dim, mech.modulus)
            row.update(dim=mech.dim, modulus_bits=mech.bits)
            print(json.dumps(row), file=sys.stderr, flush=True)
            data["in_process"].append(row)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(data, indent=1))
    for N in args.loopback:
        for secagg in (False, True):
            if any(r["N"] == N and r["secagg"] == secagg for r in data["loopback"]):
                continue
            row = loopback_round(N, secagg, args.rounds)
            print(json.dumps({k: v for k, v in row.items() if k != "rounds_log"}), file=sys.stderr, flush=True)
            data["loopback"].append(row)
            path.write_text(json.dumps(data, indent=1))
    return data


def scaling_points(files: list[Path]) -> dict[str, list[tuple[int, float, float]]]:
    r"""``series -> [(N, seconds per round, bytes per node per round)]`` from ``overhead`` JSON files.

    Series: ``secagg_loopback`` (SecAgg+'s part of each finished secure round on 127.0.0.1, bytes the
    ServerApp sent and received for it over N), ``central_loopback`` (a finished central run's wall time
    from its SuperLink's start to its end over its rounds; no byte count), ``failed_loopback`` (runs that did
    not finish: their wall time, NaN bytes), and ``in_process_all`` / ``in_process_ring`` (the cryptography
    of every node and the server in CPU seconds, with every pair or with ``2⌈log₂ N⌉ + 1`` neighbours).
    """
    out: dict[str, list[tuple[int, float, float]]] = {
        k: [] for k in ("secagg_loopback", "central_loopback", "failed_loopback", "in_process_all", "in_process_ring")
    }
    for path in files:
        data = json.loads(Path(path).read_text())
        for row in data.get("loopback", []):
            N = int(row["N"])
            if row.get("returncode"):
                out["failed_loopback"].append((N, float(row["wall_s"]), math.nan))
            elif row["secagg"]:
                for r in row.get("rounds_log") or []:
                    sa = r.get("secagg") or {}
                    if "seconds" in sa:
                        per_node = (sa["bytes_sent"] + sa["bytes_received"]) / N
                        out["secagg_loopback"].append((N, float(sa["seconds"]), per_node))
            else:
                phases = row.get("phases") or {}
                start, end = phases.get("superlink-up"), phases.get("run-done")
                if start is not None and end is not None:
                    out["central_loopback"].append((N, (end - start) / int(row["rounds"]), math.nan))
        for row in data.get("in_process", []):
            N = int(row["N"])
            series = "in_process_all" if int(row["num_shares"]) >= N else "in_process_ring"
            per_node = (row["bytes_sent"] + row["bytes_received"]) / N
            out[series].append((N, float(row["server_s"] + row["nodes_s_total"]), per_node))
    return {k: sorted(v) for k, v in out.items()}


def plot_scaling(points: dict[str, list[tuple[int, float, float]]], path: Path) -> None:
    """Two panels against N: seconds per round, bytes per node per round (log-log)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    styles = {
        "secagg_loopback": ("SecAgg+ part of a secure round, 127.0.0.1 (wall s)", "o-", "tab:red"),
        "central_loopback": ("a central run over its rounds, start-up included, 127.0.0.1 (wall s)", "s-", "tab:blue"),
        "failed_loopback": ("did not finish (wall s until it stopped)", "x", "black"),
        "in_process_all": ("cryptography, every pair (CPU s)", "^--", "tab:green"),
        "in_process_ring": ("cryptography, ring of 2⌈log₂N⌉+1 (CPU s)", "v--", "tab:olive"),
    }
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    for key, (label, fmt, color) in styles.items():
        pts = points.get(key) or []
        if not pts:
            continue
        N = [p[0] for p in pts]
        a.plot(N, [p[1] for p in pts], fmt, color=color, label=label, ms=6)
        if key not in ("central_loopback", "failed_loopback"):
            b.plot(N, [p[2] for p in pts], fmt, color=color, label=label, ms=6)
    for ax, title in ((a, "seconds per round"), (b, "bytes per node per round (sent + received)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("N (nodes)")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
    a.legend(fontsize=7)
    b.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="study", required=True)
    pl = sub.add_parser("plot", help="seconds and bytes per node per round against N, from overhead JSON files")
    pl.add_argument("png", type=Path)
    pl.add_argument("files", type=Path, nargs="+")
    u = sub.add_parser("utility", help="central vs secure at matched ε")
    u.add_argument("--reps", type=int, default=20)
    u.add_argument("--objectives", nargs="+", default=list(OBJECTIVES), choices=list(OBJECTIVES))
    u.add_argument("--quick", action="store_true", help="a tiny federation, 2 repetitions (seconds)")
    o = sub.add_parser("overhead", help="SecAgg+ time and bytes per round")
    o.add_argument("--nodes", type=int, nargs="+", default=[4, 8, 16, 32, 64])
    o.add_argument("--loopback", type=int, nargs="*", default=[4, 8, 16])
    o.add_argument("--rounds", type=int, default=2)
    for q in (u, o):
        q.add_argument("--seed", type=int, default=0)
        q.add_argument("--out", default=str(OUT))
        q.add_argument("--resume", action="store_true", help="keep the arms / cells already in the JSON")
    args = p.parse_args()
    if args.study == "plot":
        points = scaling_points(args.files)
        plot_scaling(points, args.png)
        print(json.dumps(points, indent=1))
        return
    utility(args) if args.study == "utility" else overhead(args)


if __name__ == "__main__":
    main()
