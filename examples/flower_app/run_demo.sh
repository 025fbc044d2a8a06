#!/usr/bin/env bash
# DP-FTS-DE on Flower's deployment engine, on this machine, secured: one SuperLink with TLS
# and SuperNode authentication, and N SuperNodes on 127.0.0.1, each a separate process
# holding one agent (--node-config partition-id=n) and proving its identity with its own key;
# then `flwr run` of the app in this folder. A CA, the SuperLink's certificate, the node key
# pairs and the ServerApp's agent roster are generated at start in a temporary folder
# (credentials.py); the ServerApp keeps its secret and its ledger in that folder too
# (FBO_SERVER_STATE). Prints each round's epsilon and each agent's best value, and stops
# every process it started, whatever happens.
#
#   examples/flower_app/run_demo.sh            (or: make flower-demo)
#   VENV=.venv PORT=9300 NUM_NODES=4 ROUNDS=3 examples/flower_app/run_demo.sh
#   (VENV: the environment with fbo_torch[flower]; default the repository's .venv, else the one whose
#    fbo-torch is on PATH, as in a copy made by `fbo-torch examples DIR`)
#   ROGUE=1 also starts a SuperNode whose key is not registered, claiming agent 0: it must be refused
#   SECAGG=1 aggregates every release by SecAgg+ with distributed discrete Gaussian noise: the server
#            never sees an agent's omega (aggregation = "secure"; DROPOUT_TOLERANCE, default 0.25); each
#            node signs its SecAgg+ keys with its SuperNode key and checks the others' against the roster
#   INSECURE=1 runs without TLS and node authentication (anyone who reaches the port can join)
#   OWN_OBJECTIVES=1: each SuperNode evaluates its own black box, named only in its node config (a CNN
#     on its own share of the digits, examples/flower_device/); the run config gives only the domain
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
if [[ ! -x "$VENV/bin/python" ]]; then   # a copy from `fbo-torch examples DIR`: the environment fbo-torch runs in
    VENV="$(dirname "$(dirname "$(command -v fbo-torch || echo /nonexistent/bin/fbo-torch)")")"
fi
PORT="${PORT:-9300}"                # SuperLink's HTTPS port (Fleet, Control and Runtime APIs)
NUM_NODES="${NUM_NODES:-4}"
ROUNDS="${ROUNDS:-3}"
OWN=0
[[ -n "${OWN_OBJECTIVES:-}" && "${OWN_OBJECTIVES}" != 0 ]] && OWN=1
DEVICE_DIR="$ROOT/examples/flower_device"   # what each device holds: its own objective's module
TIMEOUT="${DEMO_TIMEOUT:-300}"      # s for the whole run
SECURE=1
[[ -n "${INSECURE:-}" && "${INSECURE}" != 0 ]] && SECURE=0
RUN_CONFIG="num-agents=$NUM_NODES num-rounds=$ROUNDS report-best=true"
SECAGG_ON=0
if [[ -n "${SECAGG:-}" && "${SECAGG}" != 0 ]]; then
    SECAGG_ON=1
    RUN_CONFIG+=" aggregation=\"secure\" dropout-tolerance=${DROPOUT_TOLERANCE:-0.25}"
fi
export PATH="$VENV/bin:$PATH"       # flower-superlink spawns flower-superexec / flwr-serverapp from PATH
# N + 1 processes share this machine's cores: one torch thread each (two threads spinning on a busy
# 2-core machine made a node's CNN training ~20x slower)
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"

WORK="$(mktemp -d "${TMPDIR:-/tmp}/fbo-flower-demo.XXXXXX")"
export FLWR_HOME="$WORK/flwr-home"  # Flower's config (SuperLink connection) and app cache, kept apart
export FLWR_SUPEREXEC_TASK_POLL_INTERVAL="${FLWR_SUPEREXEC_TASK_POLL_INTERVAL:-0.3}"
# server-side configuration, inherited by the ServerApp from the SuperLink (never in the run config):
export FBO_SERVER_STATE="$WORK/server-state"   # the server's secret, ledger and rounds
mkdir -p "$FLWR_HOME"

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
if ((OWN)); then
    # each device's own data (a label-skewed share of the digits), written while the rest starts; it
    # prints the run config's objective: the federation's parameters, which every node's objective must search
    "$VENV/bin/python" "$DEVICE_DIR/digits_on_device.py" "$WORK/device-data" --nodes "$NUM_NODES" \
        > "$WORK/federation.json" &
    DATA_PID=$!
fi
if [[ "${WARM:-1}" != 0 ]]; then
    # Flower starts a fresh flwr-clientapp / flwr-serverapp process per message, and each
    # Flower process imports flwr (and the apps torch and fbo_torch) anew; shims first on
    # PATH have them forked from one process that imported everything once
    # (warm_start.py in this folder). WARM=0: the plain way.
    "$VENV/bin/python" "$HERE/warm_start.py" "$WORK/warm.sock" "$WORK/bin" "$VENV/bin" \
        > "$WORK/warm-start.log" 2>&1 &
    PIDS+=($!)
    export PATH="$WORK/bin:$PATH"
    for _ in $(seq 900); do [[ -S "$WORK/warm.sock" ]] && break; sleep 0.1; done
    phase imports-done
fi

if ((SECURE)); then
    PKI="$WORK/pki"
    "$VENV/bin/python" "$HERE/credentials.py" "$PKI" "$NUM_NODES" rogue
    export FBO_AGENT_ROSTER="$PKI/roster.json" FBO_REQUIRE_ROSTER=1  # agent n <-> the key of node n
    LINK_SECURITY=(--ssl-ca-certfile "$PKI/ca.crt" --ssl-certfile "$PKI/server.crt" --ssl-keyfile "$PKI/server.key"
                   --enable-supernode-auth)
    NODE_SECURITY=(--root-certificates "$PKI/ca.crt")
    CONNECTION="root-certificates = \"$PKI/ca.crt\""
    phase credentials-done
else
    echo "warning: INSECURE=1: no TLS, no SuperNode authentication; anyone who reaches port $PORT can join" >&2
    LINK_SECURITY=(--insecure)
    NODE_SECURITY=(--insecure)
    CONNECTION="insecure = true"
fi
cat > "$FLWR_HOME/config.toml" <<TOML
[superlink]
default = "local-demo"

[superlink.local-demo]
address = "127.0.0.1:$PORT"
$CONNECTION
TOML

flower-superlink "${LINK_SECURITY[@]}" --host 127.0.0.1 --port "$PORT" --disable-runtime-dependency-installation \
    > "$WORK/superlink.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 600); do  # SuperNodes that start before the SuperLink listens back off for seconds
    (exec 3<> "/dev/tcp/127.0.0.1/$PORT") 2> /dev/null && break
    sleep 0.1
done
phase superlink-up

if ((SECURE)); then
    # register each node's public key (before the node starts: an unknown key is refused for good)
    REG=()
    for ((n = 0; n < NUM_NODES; n++)); do
        flwr supernode register "$PKI/node-$n.pub" local-demo --format json > "$WORK/register-$n.json" 2>&1 &
        REG+=($!)
    done
    wait "${REG[@]}"
    "$VENV/bin/python" - "$WORK" "$NUM_NODES" <<'PY'
import json, sys
work, n = sys.argv[1], int(sys.argv[2])
for i in range(n):  # `flwr ... --format json` exits 0 even when the registration failed
    text = open(f"{work}/register-{i}.json").read()
    try:
        ok = json.loads(text[text.index("{"):]).get("success")
    except ValueError:
        ok = False
    if not ok:
        sys.exit(f"registering node-{i}.pub failed: {text.strip()[-300:]}")
PY
    phase keys-registered
fi
RUN_OBJECTIVE=""
if ((OWN)); then
    wait "$DATA_PID" || { echo "writing the devices' data failed" >&2; exit 1; }
    RUN_OBJECTIVE="objective='$(cat "$WORK/federation.json")'"  # the domain only: no class, no data
fi
for ((n = 0; n < NUM_NODES; n++)); do
    KEY=()
    ((SECURE)) && KEY=(--auth-supernode-private-key "$PKI/node-$n")
    NODE_CONFIG="partition-id=$n num-partitions=$NUM_NODES"
    if ((SECAGG_ON && SECURE)); then  # the node signs its SecAgg+ keys with its SuperNode key, checks others' on its roster
        NODE_CONFIG+=" secagg.private-key=\"$PKI/node-$n\" secagg.roster=\"$PKI/roster.json\""
    elif ((SECAGG_ON)); then  # no keys without TLS and authentication: the server is trusted to follow SecAgg+
        NODE_CONFIG+=" secagg.trust-server=true"
    fi
    NODE_ENV=()
    if ((OWN)); then  # the node's own black box: its module on the node's path, its data file
        NODE_CONFIG+=" objective.type=\"digits_on_device:DigitsOnDevice\" objective.data=\"$WORK/device-data/node-$n.npz\""
        NODE_ENV=(env "PYTHONPATH=$DEVICE_DIR${PYTHONPATH:+:$PYTHONPATH}")
    fi
    "${NODE_ENV[@]}" flower-supernode "${NODE_SECURITY[@]}" "${KEY[@]}" --superlink "127.0.0.1:$PORT" \
        --port $((PORT + 1 + n)) --node-config "$NODE_CONFIG" > "$WORK/supernode-$n.log" 2>&1 &
    PIDS+=($!)
done
ROGUE_PID=""
if ((SECURE)) && [[ -n "${ROGUE:-}" && "${ROGUE}" != 0 ]]; then
    flower-supernode "${NODE_SECURITY[@]}" --auth-supernode-private-key "$PKI/rogue" --superlink "127.0.0.1:$PORT" \
        --port $((PORT + 1 + NUM_NODES)) --node-config "partition-id=0 num-partitions=$NUM_NODES" \
        > "$WORK/rogue.log" 2>&1 &
    ROGUE_PID=$!
    PIDS+=($!)
fi

# the run: submitted to the SuperLink, logs streamed until the ServerApp ends. The demo asks the
# agents for their best values (report-best) to print them; a deployment leaves that off.
timeout "$TIMEOUT" flwr run "$HERE" local-demo --stream \
    --run-config "$RUN_CONFIG summary-path=\"$WORK/summary.json\" $RUN_OBJECTIVE" \
    > "$WORK/run.log" 2>&1 || { tail -n 40 "$WORK/run.log" >&2; exit 1; }
phase run-done

if [[ -n "$ROGUE_PID" ]]; then
    for _ in $(seq 100); do kill -0 "$ROGUE_PID" 2> /dev/null || break; sleep 0.1; done
    if kill -0 "$ROGUE_PID" 2> /dev/null; then
        echo "the rogue SuperNode is still running" >&2
        exit 1
    fi
    refusal=$(grep -ohE "\[code: [0-9]+\][^.]*" "$WORK/rogue.log" | head -n 1 || true)
    echo "rogue SuperNode (unregistered key, claiming agent 0): refused by the SuperLink: ${refusal:-no reason logged}"
fi

"$VENV/bin/python" - "$WORK/summary.json" "$NUM_NODES" "$ROUNDS" "$start" "$WORK/phases" "$SECURE" "$OWN" <<'PY'
import json, sys, time
path, n, T, start, secure = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), sys.argv[6] == "1"
own = sys.argv[7] == "1"
phases = "  ".join(f"{k} at {v} s" for k, v in (line.split() for line in open(sys.argv[5])))
s = json.load(open(path))
rounds = s["rounds"]
secagg = any("secagg" in r for r in rounds)
for r in rounds:
    best = "  ".join(f"agent {a}: {v:.4f} ({r['num_observations'][a]} obs)" for a, v in r["best_values"].items())
    eps = f"epsilon = {float(r['epsilon']):.4f}"
    if "epsilon_server" in r:  # secure aggregation: against other agents and outsiders, and against the server
        eps = f"epsilon (others) = {float(r['epsilon']):.4f}  epsilon (server) = {float(r['epsilon_server']):.4f}"
    sa = r.get("secagg")
    cost = f"  secagg {sa['seconds']:.2f} s {(sa['bytes_sent'] + sa['bytes_received']) / 1e3:.0f} kB" if sa else ""
    print(f"round {r['round']}: {eps}  released={r['released']}  "
          f"reported {r['num_reported']}/{n}  invalid {r['num_invalid']}{cost}  best: {best}")
ok = len(rounds) == T and all(len(r["best_values"]) == n for r in rounds) and not s["refused_nodes"]
# without a roster (INSECURE=1) nodes are bound to agents by their first reply: round 1 has no secure cohort
ok = ok and (not secagg or all(r["released"] for r in rounds[0 if secure else 1:]))
mode = "TLS + SuperNode authentication, agents bound to node keys" if secure else "INSECURE"
if own:
    mode += "; each node's own objective (node config), best = its validation accuracy"
if secagg:
    mode += ", SecAgg+ with distributed noise: the server saw no omega"
print(f"flower demo: {len(rounds)} rounds, {n} SuperNodes ({mode}), feature map {s['fingerprint']}, "
      f"{time.time() - start:.1f} s ({phases})")
sys.exit(0 if ok else 1)
PY
