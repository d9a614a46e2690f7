#!/usr/bin/env bash
# Stop the two-node cluster started by cluster/local-2node.sh — only its two nodes, found by the
# pids it recorded (plain `ray stop` would also stop any other Ray on this machine, such as an
# embedded `agentrl train` or a test run). Use the same RAY_TMPDIR as when starting it.
set -euo pipefail

export RAY_TMPDIR="${RAY_TMPDIR:-/tmp/agentrl-ray-cluster}"
PIDS="$RAY_TMPDIR/agentrl-2node/pids"
if [[ ! -s "$PIDS" ]]; then
  echo "no cluster recorded in $PIDS (nothing to stop)"
  exit 0
fi

mapfile -t pids < <(grep -E '^[0-9]+$' "$PIDS" || true)
# Worker node first, then the head. SIGTERM makes `ray start --block` take its node down.
for (( i=${#pids[@]}-1; i>=0; i-- )); do
  kill -TERM "${pids[i]}" 2>/dev/null || true
done
for _ in $(seq 30); do
  alive=0
  for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
  [[ $alive -eq 0 ]] && break
  sleep 1
done
for pid in "${pids[@]}"; do
  if kill -0 "$pid" 2>/dev/null; then
    echo "pid $pid did not stop after 30 s; sending SIGKILL" >&2
    kill -KILL "$pid" 2>/dev/null || true
  fi
done
rm -f "$PIDS"
echo "stopped the local Ray cluster (${#pids[@]} nodes; logs kept under $RAY_TMPDIR)"
