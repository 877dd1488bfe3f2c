"""Mirroring the replica into a destination Kafka cluster (`mirror:` of `replicad run`).

Sans-I/O cores: restamp.py (a stored batch re-stamped for our producer, records untouched),
offset_map.py (exact source -> destination offsets), partition_mirror.py (one partition's
state machine: transactions, sequences, reconcile after a crash), topics.py (which
destination topics to create), progress_store.py (the saved position). The asyncio shell
is shell.py; destination.py holds the destination's requests.
"""
