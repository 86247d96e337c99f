# Every target sets up .venv on first use, so a fresh clone needs nothing but python3.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test lint typecheck bench bench-overhead bench-decision bench-scrape bench-routing clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/epp stack

lint: $(STAMP)
	$(BIN)/ruff check epp tests bench
	$(BIN)/ruff format --check epp tests bench

typecheck: $(STAMP)
	$(BIN)/mypy

test: lint typecheck
	$(BIN)/python -m pytest -q

# All benchmarks (~20 minutes); results land in bench/results/.
bench: bench-overhead bench-decision bench-scrape bench-routing

bench-overhead: $(STAMP)
	$(BIN)/python -m bench.overhead
	$(BIN)/python -m bench.overhead --prompt-bytes 225280 --concurrency 20 --server-ms 0 200 --name overhead-220kb

bench-decision: $(STAMP)
	$(BIN)/python -m bench.decision

bench-scrape: $(STAMP)
	$(BIN)/python -m bench.scrape

# Two cache settings: the stress one (the pool's free KV holds 1.25 copies of every
# group's prefix) and a roomier one (2 copies); each compares round robin, least
# request, the default and the default without bounded-load affinity.
ROUTING_POLICIES := --policy round-robin --policy least-request --policy default= \
	--policy "unbounded=--config bench/configs/unbounded.yaml"

bench-routing: $(STAMP)
	$(BIN)/python -m bench.routing $(ROUTING_POLICIES)
	$(BIN)/python -m bench.routing $(ROUTING_POLICIES) --prefix-copies 2 --name routing-roomy

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
