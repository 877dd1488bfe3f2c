"""Real peers for replicad's tests: brokers, clients and tools that no one here wrote.

- `kafka`: `KafkaBroker` (Apache Kafka 4.x, KRaft, single node on 127.0.0.1) and
  `run_kafka_class` / `dump_log_segments` for Kafka's own tools. Jars: `make kafka-jars`.
- `tansu`: `TansuBroker` (memory only, sessionless Fetch; its quirks are in its doc).
- `produce`: `produce_mixed` (every codec, headers, nulls, committed and aborted
  transactions, deterministic per seed) and `consume_all` (a real consumer).
- `segments`: `read_broker_batches` / `broker_batches`, the broker's own batch bytes.
- `wire`: `fetch_once`, one raw Fetch to see sessions, aborted transactions and bytes.
- `kcat`: `run_kcat`. `admin`: topic creation that waits until topics are served.
- `process`: how peers are started, stopped, and never leaked. `service`: `Service`, the
  start/stop/`with` and port every started thing shares (brokers, the cluster, the chaos
  proxy). `broker`: `BrokerProcess`, what Kafka and Tansu share (ports kept across
  restarts, a retry when a port was taken, ready = answers Metadata, stop/kill/restart).
- `secure_kafka`: `SecureKafkaBroker`, a `KafkaBroker` with SASL_SSL, SSL (mTLS) and
  SASL_PLAINTEXT listeners and SCRAM users; `pki`: `make_test_pki`, a throw-away CA
  with broker and client certificates (the `cryptography` package).

The pytest fixtures over these are in tests/conftest.py.
"""
