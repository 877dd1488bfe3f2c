"""replicad: the follower side of Apache Kafka replication as a standalone daemon."""

__version__ = "0.1.0"
