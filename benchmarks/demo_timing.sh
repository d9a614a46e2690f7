#!/usr/bin/env bash
# Times `make demo` from a fresh clone, phase by phase, and prints a Markdown row for
# docs/benchmarks.md. Usage: benchmarks/demo_timing.sh [REPO_URL_OR_PATH]   (default: this repo)
set -euo pipefail
src="${1:-$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel)}"
work="$(mktemp -d /tmp/agentrl-demo-XXXX)"
git clone -q "$src" "$work/agentrl"
cd "$work/agentrl"
log="$work/demo.log"

t0=$(date +%s)
make install >"$log" 2>&1
t1=$(date +%s)
.venv/bin/agentrl make-model >>"$log" 2>&1
t2=$(date +%s)
.venv/bin/agentrl train configs/quickstart.yaml 2>&1 | tee -a "$log" | grep -E "^(step|held-out|training took)"
t3=$(date +%s)

last=$(grep -E "^held-out success:" "$log" | tail -1)
echo
echo "| commit | install | make-model | train (incl. engine start, evals) | total | result |"
echo "|---|---|---|---|---|---|"
printf '| %s | %dm%02ds | %dm%02ds | %dm%02ds | %dm%02ds | %s |\n' "$(git rev-parse --short HEAD)" \
  $(((t1-t0)/60)) $(((t1-t0)%60)) $(((t2-t1)/60)) $(((t2-t1)%60)) $(((t3-t2)/60)) $(((t3-t2)%60)) \
  $(((t3-t0)/60)) $(((t3-t0)%60)) "$last"
echo "full log: $log"
