# Everything a fresh clone needs is installed by these targets; nothing by hand.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: setup demo test lint peers clean

# Python environment with the package, its test extras and the real peers' clients.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,spark]'
	touch $(STAMP)

# The real peers: Apache Kafka jars (Maven), kcat (Debian).
peers:
	tools/kafka/kafka.sh fetch
	tools/install-system-deps.sh

setup: $(STAMP) peers

# Local Kafka with a sample topic, replicated by replicad into ./var/data, then shown.
demo: setup
	$(BIN)/python -m tools.demo

# The whole suite, integration tests against real brokers included.
test: setup
	$(BIN)/ruff check replicad tests tools
# pytest exits 5 when it collected nothing: a broken suite, said so and failed.
	$(BIN)/python -m pytest -q; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo 'make test: pytest collected no tests' >&2; exit 1; fi; exit $$rc

lint: $(STAMP)
	$(BIN)/ruff check replicad tests tools
	$(BIN)/ruff format --check replicad tests tools

clean:
	rm -rf $(VENV) var .pytest_cache
