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
#   HEAD_CPUS [2]          CPUs the head advertises      WORKER_CPUS [2]        CPUs the worker advertises
#                          (logical CPUs: Ray only counts them, so 2 + 2 on a 2-core machine is fine)
#   AGENT_PORT [52370]     dashboard-agent HTTP port of the head; the worker takes AGENT_PORT+1.
#                          (Ray's default, 52365, can only serve one node per machine and is the
#                          one an embedded `agentrl train` / `make test` Ray uses.)
#   CLIENT_PORT [10001]    Ray Client server port of the head (Ray's default; change it next to
#                          another head that uses it)
#   RAY_TMPDIR [/tmp/agentrl-ray-cluster]  Ray session/log folder of the head (kept apart from
#                          embedded runs); the worker node's is $RAY_TMPDIR/worker. Each node needs
#                          its own: a node unpacks a job's --working-dir into its session folder,
#                          deleting any copy already there — under a driver running from it.
#   RAY_AUTH_MODE [token]  Ray 2.60 token auth; the token lives in ~/.ray/auth_token (created if absent).
#                          `disabled` turns it off: only on a machine no one else can reach, since
#                          the dashboard binds 127.0.0.1 but Ray's GCS port listens on every interface.
#   RAY [.venv/bin/ray, else `ray` on PATH]
# Custom resources: the head advertises {"learner": 1}, the worker {"rollout": 1}. They show in
# `ray status`; `runtime.rollout_worker_resources={rollout: 1}` puts agentrl's rollout workers on
# the worker node. The learner is placed by CPU count (runtime.learner_cpus).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"  # Ray workers start in the raylet's folder: the repo root, like `make demo`

if [[ -z "${RAY:-}" ]]; then
  if [[ -x "$ROOT/.venv/bin/ray" ]]; then RAY="$ROOT/.venv/bin/ray"; else RAY="ray"; fi
fi
# Job entrypoints run with the raylets' PATH: put the ray CLI's folder (the venv's bin/, with the
# `agentrl` console script) first so `ray job submit -- agentrl train ...` finds it.
if [[ "$RAY" == */* ]]; then export PATH="$(cd "$(dirname "$RAY")" && pwd):$PATH"; fi
command -v "$RAY" >/dev/null 2>&1 || { echo "error: no ray CLI ($RAY); run \`make install\` first" >&2; exit 1; }

RAY_PORT="${RAY_PORT:-6379}"
DASHBOARD_PORT="${DASHBOARD_PORT:-8265}"
HEAD_CPUS="${HEAD_CPUS:-2}"
WORKER_CPUS="${WORKER_CPUS:-2}"
AGENT_PORT="${AGENT_PORT:-52370}"
CLIENT_PORT="${CLIENT_PORT:-10001}"
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
  --dashboard-agent-listen-port "$AGENT_PORT" --ray-client-server-port "$CLIENT_PORT" --temp-dir "$RAY_TMPDIR"
wait_nodes 1
start_node worker --address "$ADDRESS" --node-ip-address 127.0.0.1 \
  --num-cpus "$WORKER_CPUS" --resources '{"rollout": 1}' \
  --dashboard-agent-listen-port "$((AGENT_PORT + 1))" --temp-dir "$RAY_TMPDIR/worker"
wait_nodes 2

# Cross-node recipe: rollout worker and learner each ask for a whole node's CPUs, so they cannot
# share a node (only printed when the node sizes allow it).
SPLIT=$(( HEAD_CPUS < WORKER_CPUS ? HEAD_CPUS : WORKER_CPUS ))
BIG=$(( HEAD_CPUS > WORKER_CPUS ? HEAD_CPUS : WORKER_CPUS ))

cat <<MSG
Ray cluster up: 2 nodes on this machine (head: ${HEAD_CPUS} CPU + {"learner": 1}; worker: ${WORKER_CPUS} CPU + {"rollout": 1}).
Clients need the address and the same auth mode (token: \$RAY_AUTH_TOKEN, else ~/.ray/auth_token):
  export RAY_ADDRESS=$ADDRESS RAY_AUTH_MODE=$RAY_AUTH_MODE
  ray status                                   # nodes and resources
  agentrl train configs/quickstart.yaml        # a driver here joins \$RAY_ADDRESS
MSG
if (( 2 * SPLIT > BIG )); then
  cat <<MSG
  # rollout worker and learner on different nodes (each takes a whole node's CPUs):
  agentrl train configs/quickstart.yaml runtime.rollout_worker_cpus=$SPLIT runtime.learner_cpus=$SPLIT runtime.tool_actor_cpus=0
MSG
fi
cat <<MSG
As a Ray job instead (the repo, without its .gitignore'd paths, is the job's working dir; the
rollout workers on the worker node; the run folder here):
  ray job submit --address http://127.0.0.1:$DASHBOARD_PORT --working-dir . -- \\
    agentrl train configs/quickstart.yaml run.output_dir=$ROOT/runs "runtime.rollout_worker_resources={rollout: 1}"
Dashboard: http://127.0.0.1:$DASHBOARD_PORT   Stop: cluster/stop.sh
MSG
