# Everything a fresh clone needs is installed by these targets; nothing by hand, and nothing
# needs root: Python 3.11+, Java 17, Maven and Go (for the S3 test server) are all a machine
# must have.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# `make demo` (and `make kafka`) need the package and a Kafka client; `make test` also needs
# the test peers, Spark and the linters.
DEMO_STAMP := $(VENV)/.demo-installed
STAMP      := $(VENV)/.installed

.PHONY: setup demo test lint kafka kafka-jars spark-kafka-jars s3a-jars test-peers s3-server dist clean chaos-leadership

# --no-compile: pip would byte-compile every module of every package (PySpark's thousands:
# about half of the install's time); Python compiles the ones that are imported, once, into
# __pycache__ as usual. `make setup` installs everything in one pip run (one resolve, one
# build of replicad), `make demo` alone only what the demo needs.
$(DEMO_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet --no-compile -e '.[demo]'
	touch $@

$(STAMP): pyproject.toml
	test -x $(BIN)/pip || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet --no-compile -e '.[dev,spark]'
	touch $(DEMO_STAMP) $@

# Apache Kafka's jars from Maven Central, into .cache/kafka (the broker the demo and the
# integration tests run); and the storage module's test jar, into .cache/kafka-tiered (Kafka's
# LocalTieredStorage, the remote storage of the tiered-storage source test).
kafka-jars:
	tools/kafka/kafka.sh fetch
	tools/kafka/jars.sh fetch tools/kafka/tiered-pom.xml .cache/kafka-tiered

# Spark's Kafka source (spark-sql-kafka-0-10 and its dependencies) from Maven Central, into
# .cache/spark-kafka: the peer of the Spark tests' failover and of tools/bench/spark.
spark-kafka-jars:
	tools/kafka/jars.sh fetch tools/kafka/spark-kafka-pom.xml .cache/spark-kafka

# Hadoop's S3A (hadoop-aws, matching PySpark's Hadoop client) and the AWS SDK v2 bundle, from
# Maven Central into .cache/s3a (about 0.5 GB): only tools/bench/archive.py's parquet-in-bucket
# row needs them (replicad's Spark source reads buckets through boto3), so not in setup.
s3a-jars:
	tools/kafka/jars.sh fetch tools/kafka/s3a-pom.xml .cache/s3a

# kcat, a test peer from Debian's packages: installed when root, else unpacked into
# .cache/kcat without root (tools/kcat.sh).
test-peers:
	tools/kcat.sh fetch

# versitygw, the S3-compatible server (Apache-2.0) the archive tests run, built from source
# by Go into .cache/versitygw (tools/s3/versitygw.sh says why this one).
s3-server:
	tools/s3/versitygw.sh fetch

setup: $(STAMP) kafka-jars spark-kafka-jars test-peers s3-server

# Local Kafka with a sample topic, replicated by replicad into ./var/data, then shown.
demo: $(DEMO_STAMP) kafka-jars
	$(BIN)/python -m tools.demo

# The whole suite, integration tests against real brokers included. `make test
# TEST_WORKERS=2` runs it on two pytest-xdist workers that each take a whole file at a time
# (tests/conftest.py says which files share one); each worker starts the session brokers it
# needs. Two is the default: the suite mostly waits on brokers and subprocesses, so two
# workers on two cores finish it sooner (`TEST_WORKERS=1` runs it in one process).
# Byte-code is written (__pycache__, ignored by git) even where the environment says
# PYTHONDONTWRITEBYTECODE: otherwise every pytest worker and every replicad the tests start
# compiles all its modules again.
TEST_WORKERS := 2
XDIST = $(if $(filter-out 1,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile)
test: setup
	$(BIN)/ruff check replicad tests tools
# pytest exits 5 when it collected nothing: a broken suite, said so and failed.
	env -u PYTHONDONTWRITEBYTECODE $(BIN)/python -m pytest -q $(XDIST) --durations=30; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo 'make test: pytest collected no tests' >&2; exit 1; fi; exit $$rc

# Every leadership move (rolling restart, SIGKILL of the busiest leader, reassignment,
# unclean election) on a three-node cluster of its own, while replicad follows: minutes
# each, so the suite runs only the reassignment. `make chaos-leadership SEED=7`.
SEED := 0
chaos-leadership: setup
	$(BIN)/python -m tools.chaos.leadership --seed $(SEED)

# An Apache Kafka broker on 127.0.0.1:9092 with a sample topic, in the foreground until
# Ctrl-C, for trying `replicad run` by hand (state in ./var/kafka, fresh each time).
# `make kafka PORT=9093 NAME=dest`: a second one, with no sample topic, in ./var/dest (the
# mirror's destination). Set in the file (`:=`), so only the command line changes them, not
# a PORT the environment happens to carry.
PORT := 9092
NAME := kafka
kafka: $(DEMO_STAMP) kafka-jars
	$(BIN)/python -m tools.localkafka --port $(PORT) --name $(NAME)

# A wheel of replicad in ./dist (install it with pip; see the README's "Installing").
DIST ?= dist
dist: $(DEMO_STAMP)
	rm -rf $(DIST)
	$(BIN)/pip wheel --quiet --no-deps --wheel-dir $(DIST) .

# The layer, log-field and subscription checks also run in the suite (tests/test_layers.py,
# tests/test_logcheck.py, tests/test_subscribecheck.py).
lint: $(STAMP)
	$(BIN)/ruff check replicad tests tools
	$(BIN)/ruff format --check replicad tests tools
	$(BIN)/python -m tools.layers
	$(BIN)/python -m tools.logcheck
	$(BIN)/python -m tools.subscribecheck

clean:
	rm -rf $(VENV) var dist build .pytest_cache
