#!/usr/bin/env bash
# A two-node Ray cluster on this one machine, for trying agentrl's multi-node paths (cross-node
# actors, object-store weight sync, `ray job submit`) without a cloud account.
#
#   cluster/local-2node.sh            # start: head node + one worker node
#   cluster/stop.sh                   # stop exactly these two nodes
#
# Both nodes are real raylets with their own CPUs and object stores; they share this machine's
# filesystem, so a model built by `agentrl make-model` under ./.cache is visible to both.
# Settings (environment variables, defaults in brackets):
#   RAY_PORT [6379]        GCS port of the head          DASHBOARD_PORT [8265]  dashboard/job API port
#   HEAD_CPUS [1]          CPUs the head advertises      WORKER_CPUS [1]        CPUs the worker advertises
#   RAY_TMPDIR [/tmp/agentrl-ray-cluster]  Ray session/log folder (kept apart from embedded runs)
#   RAY_AUTH_MODE [token]  Ray 2.60 token auth; the token lives in ~/.ray/auth_token (created if absent).
#                          `disabled` turns it off (fine here: everything listens on 127.0.0.1 only).
#   RAY [.venv/bin/ray, else `ray` on PATH]
# Custom resources: the head advertises {"learner": 1}, the worker {"rollout": 1}. They show in
# `ray status` and any actor can target them with .options(resources=...). agentrl itself places
# actors by CPU counts (runtime.rollout_worker_cpus, runtime.learner_cpus), not by these names.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"  # Ray workers start in the raylet's folder: the repo root, like `make demo`

if [[ -z "${RAY:-}" ]]; then
  if [[ -x "$ROOT/.venv/bin/ray" ]]; then RAY="$ROOT/.venv/bin/ray"; else RAY="ray"; fi
fi
command -v "$RAY" >/dev/null 2>&1 || { echo "error: no ray CLI ($RAY); run \`make install\` first" >&2; exit 1; }

RAY_PORT="${RAY_PORT:-6379}"
DASHBOARD_PORT="${DASHBOARD_PORT:-8265}"
HEAD_CPUS="${HEAD_CPUS:-1}"
WORKER_CPUS="${WORKER_CPUS:-1}"
export RAY_TMPDIR="${RAY_TMPDIR:-/tmp/agentrl-ray-cluster}"
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-token}"
# Same offline/cache settings as the Makefile; actors inherit the raylets' environment.
export AGENTRL_CACHE="${AGENTRL_CACHE:-$ROOT/.cache}"
export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}" TRANSFORMERS_OFFLINE="${TRANSFORMERS_OFFLINE:-1}"
export PYTHONUNBUFFERED=1

STATE="$RAY_TMPDIR/agentrl-2node"   # pids and logs of the two `ray start --block` processes
ADDRESS="127.0.0.1:$RAY_PORT"

if [[ -f "$STATE/pids" ]]; then
  while read -r pid; do
    if [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null; then
      echo "error: a cluster started by this script is still running (pid $pid); cluster/stop.sh first" >&2
      exit 1
    fi
  done <"$STATE/pids"
fi
mkdir -p "$STATE"
: >"$STATE/pids"

if [[ "$RAY_AUTH_MODE" == "token" ]]; then
  "$RAY" get-auth-token --generate >/dev/null  # reuses ~/.ray/auth_token when it exists
fi

# `ray start --block` stays in the foreground and takes its node down on SIGTERM, so stop.sh can
# end exactly these nodes by pid (plain `ray stop` would stop every Ray node on the machine).
start_node() {  # name, then ray start arguments
  local name="$1"; shift
  setsid "$RAY" start --block --disable-usage-stats "$@" >"$STATE/$name.log" 2>&1 </dev/null &
  echo $! >>"$STATE/pids"
}

wait_nodes() {  # until N alive nodes (or give up after ~60 s)
  local want="$1" have=0
  for _ in $(seq 60); do
    have="$( { "$RAY" status --address "$ADDRESS" 2>/dev/null || true; } |
             awk '/^Active:/{a=1;next} /^(Idle|Pending):/{a=0} a && /node_/{n++} END{print n+0}')"
    [[ "$have" -ge "$want" ]] && return 0
    sleep 1
  done
  echo "error: $have of $want Ray nodes came up; logs: $STATE/*.log" >&2
  tail -n 20 "$STATE"/*.log >&2 || true
  exit 1
}

start_node head --head --node-ip-address 127.0.0.1 --port "$RAY_PORT" \
  --num-cpus "$HEAD_CPUS" --resources '{"learner": 1}' \
  --include-dashboard true --dashboard-host 127.0.0.1 --dashboard-port "$DASHBOARD_PORT" \
  --temp-dir "$RAY_TMPDIR"
wait_nodes 1
start_node worker --address "$ADDRESS" --node-ip-address 127.0.0.1 \
  --num-cpus "$WORKER_CPUS" --resources '{"rollout": 1}'
wait_nodes 2

cat <<MSG
Ray cluster up: 2 nodes on this machine (head ${HEAD_CPUS} CPU + {"learner": 1}, worker ${WORKER_CPUS} CPU + {"rollout": 1}).
  RAY_ADDRESS=$ADDRESS            (GCS; auth mode: $RAY_AUTH_MODE)
  dashboard / job API: http://127.0.0.1:$DASHBOARD_PORT
Run a driver here against it (agentrl joins \$RAY_ADDRESS instead of starting its own Ray):
  export RAY_ADDRESS=$ADDRESS RAY_AUTH_MODE=$RAY_AUTH_MODE
  agentrl train configs/quickstart.yaml
or submit it as a Ray job (the repo is uploaded as the job's working dir; .gitignore'd paths such
as .cache/ are left out, so point model.path at the absolute path of a model built here):
  RAY_AUTH_MODE=$RAY_AUTH_MODE ray job submit --address http://127.0.0.1:$DASHBOARD_PORT --working-dir . -- \\
    agentrl train configs/quickstart.yaml model.path=$AGENTRL_CACHE/models/tiny-agent
  ray status --address $ADDRESS        # nodes and resources
Stop it with cluster/stop.sh.
MSG
