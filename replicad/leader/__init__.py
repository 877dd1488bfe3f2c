"""`replicad serve`: the leader side -- a read-only Kafka-protocol server over the local log."""
