#!/usr/bin/env bash
# DP-FTS-DE on Flower's deployment engine, on this machine: one SuperLink and
# N SuperNodes on 127.0.0.1 (insecure: no TLS, no node authentication), each
# SuperNode a separate process holding one agent (--node-config partition-id=n),
# then `flwr run` of the app in this folder. Prints each round's ε and each
# agent's best value, and stops every process it started, whatever happens.
#
#   examples/flower_app/run_demo.sh            (or: make flower-demo)
#   VENV=.venv PORT=9300 NUM_NODES=4 ROUNDS=3 examples/flower_app/run_demo.sh
#   KEEP=1 keeps the logs, WARM=0 starts every Flower process the plain way (slower)
set -euo pipefail

# Become a child subreaper (Linux prctl PR_SET_CHILD_SUBREAPER), so Flower's detached
# SuperExec and app processes are re-parented to this script, reaped by it, and never
# left behind as orphans or zombies, however they end.
if [[ -z "${FBO_DEMO_REAPER:-}" ]] && command -v python3 > /dev/null; then
    export FBO_DEMO_REAPER=1
    exec python3 -c 'import ctypes, os, sys
ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)
os.execv("/bin/bash", ["bash", *sys.argv[1:]])' "$0" "$@"
fi

HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"
PORT="${PORT:-9300}"                # SuperLink's HTTP port (Fleet, Control and Runtime APIs)
NUM_NODES="${NUM_NODES:-4}"
ROUNDS="${ROUNDS:-3}"
TIMEOUT="${DEMO_TIMEOUT:-300}"      # s for the whole run
export PATH="$VENV/bin:$PATH"       # flower-superlink spawns flower-superexec / flwr-serverapp from PATH

WORK="$(mktemp -d "${TMPDIR:-/tmp}/fbo-flower-demo.XXXXXX")"
export FLWR_HOME="$WORK/flwr-home"  # Flower's config (SuperLink connection) and app cache, kept apart
export FLWR_SUPEREXEC_TASK_POLL_INTERVAL="${FLWR_SUPEREXEC_TASK_POLL_INTERVAL:-0.3}"
mkdir -p "$FLWR_HOME"
cat > "$FLWR_HOME/config.toml" <<TOML
[superlink]
default = "local-demo"

[superlink.local-demo]
address = "127.0.0.1:$PORT"
insecure = true
TOML

PIDS=()
descendants() {  # every process below $1
    local c
    for c in $(ps -o pid= --ppid "$1" 2>/dev/null); do
        echo "$c"
        descendants "$c"
    done
}
cleanup() {
    local rc=$? all=() p
    for p in "${PIDS[@]}"; do
        all+=("$p")
        mapfile -t -O "${#all[@]}" all < <(descendants "$p")
    done
    if ((${#all[@]})); then
        kill -TERM "${all[@]}" 2>/dev/null || true
        for _ in $(seq 50); do
            kill -0 "${all[@]}" 2>/dev/null || break
            sleep 0.1
        done
        kill -KILL "${all[@]}" 2>/dev/null || true
    fi
    wait 2>/dev/null || true  # reap them (and any orphan re-parented to this subreaper)
    if ((rc != 0)); then
        echo "flower demo failed (exit $rc); logs in $WORK" >&2
    elif [[ -n "${KEEP:-}" ]]; then
        echo "logs in $WORK"
    else
        rm -rf "$WORK"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

start=$(date +%s.%N)
start_ms=$(($(date +%s%N) / 1000000))
phase() { local ms=$(($(date +%s%N) / 1000000 - start_ms)); echo "$1 $((ms / 1000)).$((ms % 1000 / 100))" >> "$WORK/phases"; }
if [[ "${WARM:-1}" != 0 ]]; then
    # Flower starts a fresh flwr-clientapp / flwr-serverapp process per message, and each
    # Flower process imports flwr (and the apps torch and fbo_torch) anew; shims first on
    # PATH have them forked from one process that imported everything once
    # (fbo_torch/flower/warm_start.py). WARM=0: the plain way.
    "$VENV/bin/python" -m fbo_torch.flower.warm_start "$WORK/warm.sock" "$WORK/bin" "$VENV/bin" \
        > "$WORK/warm-start.log" 2>&1 &
    PIDS+=($!)
    export PATH="$WORK/bin:$PATH"
    for _ in $(seq 900); do [[ -S "$WORK/warm.sock" ]] && break; sleep 0.1; done
    phase imports-done
fi
flower-superlink --insecure --host 127.0.0.1 --port "$PORT" --disable-runtime-dependency-installation > "$WORK/superlink.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 600); do  # SuperNodes that start before the SuperLink listens back off for seconds
    (exec 3<> "/dev/tcp/127.0.0.1/$PORT") 2> /dev/null && break
    sleep 0.1
done
phase superlink-up
for ((n = 0; n < NUM_NODES; n++)); do
    flower-supernode --insecure --superlink "127.0.0.1:$PORT" --port $((PORT + 1 + n)) \
        --node-config "partition-id=$n num-partitions=$NUM_NODES" > "$WORK/supernode-$n.log" 2>&1 &
    PIDS+=($!)
done

# the run: submitted to the SuperLink, logs streamed until the ServerApp ends
timeout "$TIMEOUT" flwr run "$HERE" local-demo --stream \
    --run-config "num-agents=$NUM_NODES num-rounds=$ROUNDS summary-path=\"$WORK/summary.json\"" \
    > "$WORK/run.log" 2>&1 || { tail -n 40 "$WORK/run.log" >&2; exit 1; }
phase run-done

"$VENV/bin/python" - "$WORK/summary.json" "$NUM_NODES" "$ROUNDS" "$start" "$WORK/phases" <<'PY'
import json, sys, time
path, n, T, start = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
phases = "  ".join(f"{k} at {v} s" for k, v in (line.split() for line in open(sys.argv[5])))
s = json.load(open(path))
rounds = s["rounds"]
for r in rounds:
    best = "  ".join(f"agent {a}: {v:.4f} ({r['num_observations'][a]} obs)" for a, v in r["best_values"].items())
    print(f"round {r['round']}: epsilon = {r['epsilon']:.4f}  released={r['released']}  "
          f"reported {r['num_reported']}/{n}  best: {best}")
ok = len(rounds) == T and all(len(r["best_values"]) == n for r in rounds) and not s["refused_nodes"]
print(f"flower demo: {len(rounds)} rounds, {n} SuperNodes, feature map {s['fingerprint']}, "
      f"{time.time() - start:.1f} s ({phases})")
sys.exit(0 if ok else 1)
PY
