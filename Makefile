# Trialbus: `make run` runs the whole stack and a demo experiment; `make test` runs the suite.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install run up test bench schemas clean sshd

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)  ## the whole stack on an embedded nats-server, plus the demo experiment
	$(BIN)/trialbus up -- $(BIN)/python examples/random-search/tuner.py

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

test: $(STAMP) sshd  ## lint, layering, then the suite
	$(BIN)/ruff check contracts services trialbus bench tests
	$(BIN)/lint-imports
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/python -m bench

schemas: $(STAMP)
	$(BIN)/python -m contracts.schemas

clean:
	rm -rf $(VENV) .trialbus
