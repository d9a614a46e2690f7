#!/usr/bin/env bash
# benchmarks/gpu_learner_check.py on a machine without DeepSpeed and without network (the lent GPU
# machine: CUDA torch, transformers and peft, no Ray / vLLM / DeepSpeed / pydantic). See the .py's
# docstring for what the check compares.
#
#   benchmarks/gpu_learner_check.sh --prepare   # where pip reaches PyPI: the wheels into .cache/gpu-wheels/
#   benchmarks/gpu_learner_check.sh [ARGS...]   # on the GPU machine: install the carried wheels, run the check
#
# Device tool:  run(command="bash benchmarks/gpu_learner_check.sh", carry=[".cache/gpu-wheels"], timeout_s=600)
#
# ARGS go to the check (its default: --device cuda; e.g. --quick). Environment: LIMIT bounds the check
# (seconds, default 540: inside the tool's 600), PYTHON picks the interpreter (default python3, on
# the GPU image the one with CUDA torch; --prepare: .venv/bin/python), OUT (set by the device tool)
# receives gpu_learner_check.json, GPU_WHEELS names another wheel folder, GPU_PYTHON_VERSION the
# target Python of --prepare (3.12). The wheels are installed only when deepspeed, hjson or pydantic
# does not import, with pip --no-index --no-deps into a --target folder put first on PYTHONPATH.
set -uo pipefail
cd "$(dirname "$0")/.."
WHEELS=${GPU_WHEELS:-.cache/gpu-wheels}

prepare() {
  # Versions: this venv's, the ones the CPU tests pass with (pydantic and pydantic-core must match).
  # The GPU image runs CPython 3.12 on x86-64 (GPU_PYTHON_VERSION to change): only pydantic-core is
  # compiled; PyPI has deepspeed as an sdist only, so it is built here into a pure-python wheel with
  # no ops (DS_BUILD_OPS=0: CPU Adam is JIT-compiled where it is first used).
  local py=${PYTHON:-.venv/bin/python} pyver=${GPU_PYTHON_VERSION:-3.12} pins
  pins=$("$py" - <<'PY'
from importlib.metadata import version
print(" ".join(f"{n}=={version(n)}" for n in
               ("hjson", "pydantic", "pydantic-core", "annotated-types", "typing-inspection", "typing-extensions")))
PY
) || return 1
  local ds
  ds=$("$py" -c 'from importlib.metadata import version; print(version("deepspeed"))') || return 1
  mkdir -p "$WHEELS" && rm -f "$WHEELS"/*.whl || return 1
  echo "building deepspeed==$ds (pure python, DS_BUILD_OPS=0) and downloading: $pins"
  DS_BUILD_OPS=0 "$py" -m pip wheel -q --no-deps --no-build-isolation "deepspeed==$ds" -w "$WHEELS" || return 1
  # shellcheck disable=SC2086  # $pins: one argument per requirement
  "$py" -m pip download -q --no-deps --only-binary=:all: --python-version "$pyver" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$WHEELS" $pins || return 1
  ls -l "$WHEELS"
  du -sh "$WHEELS"
  echo "carry it: run(command=\"bash benchmarks/gpu_learner_check.sh\", carry=[\"$WHEELS\"], timeout_s=600)"
}

if [ "${1:-}" = "--prepare" ]; then
  prepare || { echo "gpu_learner_check.sh --prepare: FAILED" >&2; exit 1; }
  exit 0
fi

PY=${PYTHON:-python3}
if ! "$PY" -c "import deepspeed, hjson, pydantic" >/dev/null 2>&1; then
  if ! compgen -G "$WHEELS/*.whl" >/dev/null; then
    echo "no deepspeed for $PY and no wheels in $WHEELS: run benchmarks/gpu_learner_check.sh --prepare where pip reaches PyPI"
    echo "GPU LEARNER CHECK: FAIL (failed: setup)"
    exit 1
  fi
  SITE=${SITE:-/tmp/gpu-learner-check-site}
  if ! "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$WHEELS"/*.whl; then
    echo "GPU LEARNER CHECK: FAIL (failed: installing $WHEELS)"
    exit 1
  fi
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PATH="$("$PY" -c 'import os, sys; print(os.path.dirname(sys.executable))'):$PATH"  # ninja, for DeepSpeed's JIT ops
export PATH DS_BUILD_OPS=0 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$PWD/.cache/torch_extensions}
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader

LIMIT=${LIMIT:-540}
if [ -n "${OUT:-}" ]; then
  timeout -k 10 "$LIMIT" "$PY" benchmarks/gpu_learner_check.py "$@" --out "$OUT/gpu_learner_check.json"
else
  timeout -k 10 "$LIMIT" "$PY" benchmarks/gpu_learner_check.py "$@"
fi
rc=$?
if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
  echo "GPU LEARNER CHECK: FAIL (failed: timed out after $LIMIT s)"
fi
exit "$rc"
