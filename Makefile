# llmtrain: `make demo` trains a tiny model locally; `make test` runs every test. `make help` lists all.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PY := $(BIN)/python
STAMP := $(VENV)/.installed
# The CPU build is enough for tests and the demo; a GPU machine may set TORCH_SPEC to a CUDA build.
TORCH_SPEC ?= torch==2.13.0
DEEPSPEED_SPEC ?= deepspeed==0.19.8
# Extra arguments for pytest in `make test` (every tier runs, the kind end-to-end run among them).
PYTEST_ARGS ?=

.PHONY: help install test test-fast lock lint format generate demo render-example manifests e2e \
        tools images prepare cluster cluster-down mutate bench-operator bench-trainer bench-gpu bench-tokenize clean

help: ## list the targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-16s %s\n", $$1, $$2}'

# Exact versions of everything but torch (constraints.txt, `make lock`): CI installs what was tested.
$(STAMP): pyproject.toml constraints.txt operator/llmtrain/constants.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -c constraints.txt --upgrade pip wheel setuptools
	$(PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet -c constraints.txt -e '.[operator,train,track,dev]'
	# DeepSpeed's build imports torch, so it must see the installed one (no build isolation).
	DS_BUILD_OPS=0 $(PY) -m pip install --quiet -c constraints.txt --no-build-isolation "$(DEEPSPEED_SPEC)"
	touch $(STAMP)

install: $(STAMP) ## create .venv and install llmtrain with every extra

# On a cold machine Go compiles the cluster's binaries for 20-odd minutes (CPU) while the venv, the
# Node.js tool and the images mostly wait on downloads (PyPI's torch, npm, Debian packages) and the
# disk: so builds-start starts the Go build, the images and kind's node image (tests/e2e/run.sh
# --prepare: Debian packages and Go modules, in local mode; nothing with Docker) first, in the
# background, as soon as the Debian packages (apt, one at a time) are in and a bare venv can run
# build_tools.py and images.py (stdlib and operator/ only; `--go` finds or installs go before
# anything else pips into the venv), and the venv's install and the Node.js tool follow in the
# foreground (test-ready). Each background step's exit status lands in LOG.rc once its process
# (LOG.pid) ends. `make test` does not wait for them: its lanes start once the venv is ready, with
# the logs' paths in LLMTRAIN_TOOLS_LOG, LLMTRAIN_IMAGES_LOG and LLMTRAIN_KIND_LOG, and a test that
# needs what a step builds waits for that step where it uses it (tests/support/builds.py: the
# cluster and the test servers for the tools, tests/images and tests/pods for the images,
# tests/e2e/test_kind.py for all three), failing with the log's tail if the step failed. After the
# lanes `make test` awaits the three steps anyway, so that a failed build fails it even when no
# test needed it. `make prepare` awaits them before it returns. A failure (or no status: killed)
# fails with the log's tail. Warm, every step is a check (about a second).
# The order matters, hence .NOTPARALLEL (make 4.3 has no per-target form).
TOOLS_LOG ?= $(VENV)/tools-build.log
IMAGES_LOG ?= $(VENV)/images-build.log
KIND_LOG ?= $(VENV)/kind-build.log
# $(call background,LOG,COMMAND) and $(call await,LOG): one line of a recipe each.
background = rm -f $(1).rc; { $(2); echo $$? >$(1).rc; } >$(1) 2>&1 & echo $$! >$(1).pid
await = while [ ! -s $(1).rc ] && kill -0 "$$(cat $(1).pid)" 2>/dev/null; do sleep 0.2; done; \
  if [ "$$(cat $(1).rc 2>/dev/null)" != 0 ]; then tail -50 $(1); echo "failed: see $(1)"; exit 1; fi
.NOTPARALLEL:
.PHONY: builds-start test-ready
builds-start:
	bash hack/install_node_deps.sh
	@# A new venv gets its pip first: images.py's `pip download` must not run while pip is replaced.
	@test -x $(PY) || { $(PYTHON) -m venv $(VENV) && $(PY) -m pip install --quiet -c constraints.txt --upgrade pip wheel setuptools; }
	PYTHONPATH=operator $(PY) -c 'from hack import images; images.ensure_host_tools()'
	@$(PY) hack/tools/build_tools.py --go >/dev/null
	@echo "building the cluster's binaries, the images and kind's node image in the background (logs: $(TOOLS_LOG), $(IMAGES_LOG), $(KIND_LOG))"
	@$(call background,$(TOOLS_LOG),$(PY) hack/tools/build_tools.py)
	@$(call background,$(IMAGES_LOG),PYTHONPATH=operator $(PY) hack/images.py)
	@$(call background,$(KIND_LOG),PATH=$(BIN):$$PATH PYTHON=$(PY) bash tests/e2e/run.sh --prepare)

test-ready: builds-start $(STAMP)
	$(PY) hack/node_tools/node_tools.py

prepare: test-ready ## build the cluster's binaries (tools), the images and kind's node image beside the venv's install and the Node.js tool, and wait for them
	@$(call await,$(IMAGES_LOG)); tail -4 $(IMAGES_LOG)
	@$(call await,$(TOOLS_LOG)); cat $(TOOLS_LOG)
	@$(call await,$(KIND_LOG)); tail -2 $(KIND_LOG)

test: test-ready ## run every test tier (unit, real cluster, trainer, chart, real pods, the kind end-to-end run), in three lanes
	@LLMTRAIN_TOOLS_LOG=$(abspath $(TOOLS_LOG)) LLMTRAIN_IMAGES_LOG=$(abspath $(IMAGES_LOG)) \
	  LLMTRAIN_KIND_LOG=$(abspath $(KIND_LOG)) $(PY) hack/run_tests.py $(PYTEST_ARGS); status=$$?; \
	  echo "the background builds:"; \
	  $(call await,$(IMAGES_LOG)); tail -4 $(IMAGES_LOG); \
	  $(call await,$(TOOLS_LOG)); cat $(TOOLS_LOG); \
	  $(call await,$(KIND_LOG)); tail -2 $(KIND_LOG); \
	  exit $$status

# pytest runs on 2 pytest-xdist workers, --dist worksteal: each starts with a contiguous half of the
# tests (a module's servers and probes start in one worker, not in both as with --dist load) and an
# idle one takes tests from the other's tail. 1 min 55 s wall on a quiet machine on 2026-11-29
# (2,078 tests, pytest 99 s; in one process 1 min 58 s for 2,025 tests, pytest 107 s), mypy
# warm (its .mypy_cache; a cold one adds about 90 s). Real training runs are `slow`, seconds-long
# checks `thorough`: both run in `make test` only (tests/README.md).
test-fast: $(STAMP) ## the inner loop (about 2 min): lint, unit, chart, e2e script checks, trainer checks without Ray
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(PY) -m pytest -q -n 2 --dist worksteal -m "not e2e and not slow and not thorough" tests/unit tests/chart tests/e2e tests/trainer

lock: $(STAMP) ## rewrite constraints.txt from the current venv (after `make test` passed with new versions)
	bash hack/lock.sh $(PY)

tools: $(STAMP) ## build the real cluster's and test servers' binaries (hack/tools/*/go.mod, hack/node_tools/*) into ~/.cache/llmtrain
	bash hack/install_node_deps.sh
	$(PY) hack/tools/build_tools.py
	$(PY) hack/node_tools/node_tools.py

images: $(STAMP) ## build the operator and trainer images (buildah, Debian bases) into ~/.cache/llmtrain/images
	$(PY) hack/images.py

CLUSTER_DIR ?= .cluster
cluster: tools ## start a local cluster (real control plane, a real node with the images, KubeRay, Kueue, fake GPU nodes) in .cluster/
	$(PY) -m tests.support.cluster up --dir $(CLUSTER_DIR)

cluster-down: ## stop every process `make cluster` started
	$(PY) -m tests.support.cluster down --dir $(CLUSTER_DIR)

lint: $(STAMP) ## ruff and mypy
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

format: $(STAMP) ## apply ruff's formatting and fixes
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# The checkout's own packages first: the venv's editable install points at the checkout it was made
# in, so from a worktree or a copy it would generate from another tree's code.
generate: $(STAMP) ## write every generated file: CRD, RBAC rules, API docs, chart values, manifests/
	PYTHONPATH=operator:trainer_image $(PY) -m llmtrain.generate
	PYTHONPATH=operator:trainer_image $(PY) hack/render_manifests.py

manifests: generate ## render manifests/ from the chart with Helm's engine (after `generate`)

demo: $(STAMP) ## train examples/tiny-cpu.yaml locally on CPU (a few minutes)
	$(BIN)/llmtrain run examples/tiny-cpu.yaml

render-example: $(STAMP) ## print what the 8B FSDP example becomes in the cluster
	$(BIN)/llmtrain render examples/llama3-8b-fsdp.yaml

MUTATE_ARGS ?=
mutate: $(STAMP) ## mutation testing of the core (mutmut; verdicts kept in tests/mutation/verdicts.json; not in `make test`): prints mutation_score=
	nice -n 15 $(PY) hack/mutate.py $(MUTATE_ARGS)

e2e: $(STAMP) ## kind end-to-end test (docker, kind, helm, kubectl; without Docker, as root: kind on Podman, all built here)
	LLMTRAIN=$(BIN)/llmtrain PYTHON=$(PY) bash tests/e2e/run.sh

# The issue's figures: a burst of 1,000 and 10 jobs/s against the plain-client ceiling, then peak RSS
# beside 1,000 and 5,000 kept jobs. Smaller: BENCH_JOBS=200 BENCH_STEADY=100 BENCH_RETAINED=1000.
BENCH_JOBS ?= 1000
BENCH_STEADY ?= 300
BENCH_RETAINED ?= 1000 5000
bench-operator: $(STAMP) tools ## operator throughput and memory on a real control plane, against a plain client's ceiling
	$(PY) benchmarks/operator_throughput.py --jobs $(BENCH_JOBS) $(BENCH_ARGS)
	$(PY) benchmarks/operator_throughput.py --rate 10 --jobs $(BENCH_STEADY) $(BENCH_ARGS)
	for n in $(BENCH_RETAINED); do $(PY) benchmarks/operator_throughput.py --retained $$n $(BENCH_ARGS) || exit 1; done

bench-trainer: $(STAMP) ## trainer loop overhead vs a minimal FSDP2 loop, chunked-loss peak memory, LoRA/full and packed/padded SFT tokens/s (CPU)
	$(PY) benchmarks/trainer_overhead.py
	PYTHONPATH=trainer_image:operator $(PY) benchmarks/loss_memory.py
	PYTHONPATH=trainer_image:operator $(PY) benchmarks/lora_speed.py
	PYTHONPATH=trainer_image:operator $(PY) benchmarks/packed_sft.py

bench-gpu: $(STAMP) ## tokens/s, MFU, peak memory vs the estimate on one local GPU, without Ray (FSDP2, DDP, LoRA, checkpointing)
	$(PY) benchmarks/gpu_mfu.py

bench-tokenize: $(STAMP) ## tokenisation MB/s at 1 and 2 processes, and a restart from the cache (BENCH_ARGS="--mb 64")
	PYTHONPATH=trainer_image:operator $(PY) benchmarks/tokenize_throughput.py $(BENCH_ARGS)

clean: ## remove the virtualenv, caches and local runs
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache llmtrain-runs
