# Trialbus: `make run` runs the whole stack and a demo experiment; `make test` runs the suite; `make docs` the site.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# NNI itself, for the tests of NNI's tuner classes in the tuner service and of trials on the real SDK. Kept
# out of the venv: with nni importable, every other test's trials would load it (seconds each) instead of the shim.
NNI_SDK := .nni-sdk

.PHONY: install run up test typecheck docs bench soak fuzz schemas clean sshd chromium docker wheelhouse image compose-test failover bench-scale bench-running bench-shares

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)  ## the whole stack on an embedded nats-server, plus the demo experiment
	$(BIN)/trialbus up -- $(BIN)/trialbus experiment run -f examples/nni-tpe/config.yml

up: $(STAMP)  ## the stack in the foreground until Ctrl-C
	$(BIN)/trialbus up

# The remote adapter's tests run a real OpenSSH sshd: install it where it is missing and we can.
sshd:
	@if ! command -v sshd >/dev/null 2>&1 && [ ! -x /usr/sbin/sshd ]; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			echo "installing openssh-server (the remote adapter's tests need sshd)"; \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssh-server >/dev/null; \
		else \
			echo "sshd not found: install openssh-server to run the remote adapter's tests"; \
		fi; \
	fi

# The web UI's tests drive a real headless Chromium (Debian's package, through playwright).
chromium:
	@if ! command -v chromium >/dev/null 2>&1; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			echo "installing chromium (the web UI's browser tests need it)"; \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
		else \
			echo "chromium not found: install it to run the web UI's browser tests"; \
		fi; \
	fi

# The compose tests run a real Docker engine. Started here in the background while the suite runs: Debian's engine
# installed where it is missing and we can (root, apt), dockerd started, the images built (tests/fixtures/docker.py;
# the compose tests run last and wait for it).
docker: | $(STAMP)
	@$(BIN)/python -m tests.fixtures.docker --background

$(NNI_SDK)/.installed: pyproject.toml | $(STAMP)
	$(BIN)/pip install -q --target $(NNI_SDK) 'nni>=3.0'
	touch $@

# PyTorch's CPU build beside it, for the warm-start tests of trials that import torch (numpy and scikit-learn come
# with nni). Pinned to the CPU file on this machine's disk: a bare `torch` would fetch a CUDA build of several GB.
$(NNI_SDK)/.torch-installed: $(NNI_SDK)/.installed
	$(BIN)/pip install -q --target $(NNI_SDK) 'torch==2.13.0'
	touch $@

test: $(STAMP) $(NNI_SDK)/.installed $(NNI_SDK)/.torch-installed sshd chromium docker  ## lint, layering, the docs, then the suite
	$(BIN)/ruff check contracts services trialbus bench tests docs/gen hydra_plugins
	$(BIN)/ruff format --check contracts services trialbus bench tests docs/gen hydra_plugins
	$(BIN)/lint-imports
	$(MAKE) typecheck
	$(MAKE) docs
	$(BIN)/python -m pytest -q --durations=25 -n $(or $(WORKERS),2) --dist loadfile

# Types: mypy over contracts, services, trialbus and bench, as pyproject's [tool.mypy] says (strict on the contracts
# and services/common).
typecheck: $(STAMP)  ## mypy, part of make test
	$(BIN)/mypy

# The documentation site (mkdocs.yml, docs/) into site/, every warning an error: a broken link or anchor, a page
# missing from the nav, a reference page (CLI, REST, settings) that docs/gen/reference.py cannot generate.
# The two variables silence a banner that mkdocs-material and mkdocs-gen-files print about MkDocs 2.0.
docs: $(STAMP)  ## the documentation site into site/
	NO_MKDOCS_2_WARNING=1 DISABLE_MKDOCS_2_WARNING=true $(BIN)/mkdocs build --strict --site-dir site

bench: $(STAMP) $(NNI_SDK)/.installed
	$(BIN)/python -m bench

# One experiment of TRIALS trials (100000) through the fake adapter (no processes), CONCURRENCY (1000) at once: the
# submit and end rates as it grows, API p50/p95 at that size (summary, pages, one trial), the dispatcher's restart.
bench-scale: $(STAMP)
	$(BIN)/python -m bench.scale --trials $(or $(TRIALS),100000) --concurrency $(or $(CONCURRENCY),1000)

# How long the dispatcher's sharing decisions take (teams' quotas, fair share, preemption): 100 experiments
# of 10 teams waiting with 100,000 queued trials for a full platform of 64 GPUs, then a tenth as many queued.
bench-shares: $(STAMP)
	$(BIN)/python -m bench.shares

# COUNT (1,000) sleeping trials running at once on the local adapter: keeper memory, services' CPU
bench-running: $(STAMP)
	$(BIN)/python -m bench.running --count $(or $(COUNT),1000)

# TRIALS trials (300) of 20 metrics each while the adapter, the gateway, nats-server, the dispatcher
# and the tuner are each SIGKILLed once under `trialbus up`: prints lost / duplicated / stuck, exits 1 on any.
soak: $(STAMP)
	$(BIN)/python -m bench.soak --trials $(or $(TRIALS),300)

# The METRICS stream's leader node SIGKILLed KILLS times (2) under `trialbus up --cluster 3` while TRIALS trials (120)
# of 20 metrics run, each node down DOWN s (10): prints lost / duplicated and the pause, exits 1 on any loss or duplicate.
failover: $(STAMP)
	$(BIN)/python -m bench.failover --trials $(or $(TRIALS),120) --kills $(or $(KILLS),2) --down $(or $(DOWN),10)

# Every HTTP endpoint of the dispatcher, the gateway and the web UI fuzzed from its OpenAPI schema, longer than
# `make test` does: FUZZ_EXAMPLES cases (500) per operation and generation mode, a new seed each run (FUZZ_SEED=n
# replays one); prints each operation's calls and answers, fails on a 5xx, a hang or a refusal that changed state.
fuzz: $(STAMP)  ## fuzz every HTTP endpoint from its OpenAPI schema (FUZZ_EXAMPLES=500, FUZZ_SEED=random)
	FUZZ_EXAMPLES=$(or $(FUZZ_EXAMPLES),500) FUZZ_SEED=$(or $(FUZZ_SEED),random) \
		$(BIN)/python -m pytest -q -p no:cacheprovider --timeout=0 tests/e2e/test_fuzz.py

# Every dependency as a wheel in wheelhouse/ (and hatchling, to build Trialbus): the image then builds with no
# package index (an air-gapped build). Remade when pyproject.toml changes.
wheelhouse: $(STAMP)
	$(BIN)/python -c 'from tests.fixtures.docker import wheelhouse; wheelhouse()'

# The image, from the wheelhouse, on BASE_IMAGE (default: the official slim Python; any image with Python 3.11 and
# its venv module does): make image BASE_IMAGE=my-registry/python:3.11 IMAGE=trialbus:dev
image: wheelhouse
	docker build --build-arg BASE_IMAGE=$(or $(BASE_IMAGE),python:3.11-slim-bookworm) -t $(or $(IMAGE),ghcr.io/trialbus/trialbus:0.1.0) .

# The compose tests on their own: the engine (started as root where it is missing), a base image made offline with
# debootstrap, the wheelhouse, the image with both builders, then compose.yaml with Compose v2 and v1.
compose-test: $(STAMP)
	$(BIN)/python -m tests.fixtures.docker
	$(BIN)/python -m pytest -q -s -p no:cacheprovider tests/e2e/test_compose.py

schemas: $(STAMP)
	$(BIN)/python -m contracts.schemas

clean:
	rm -rf $(VENV) $(NNI_SDK) .trialbus site wheelhouse/*.whl wheelhouse/.pyproject-sha256
