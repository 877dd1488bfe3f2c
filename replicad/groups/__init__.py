"""Consumer groups: the classic group coordinator `replicad serve` runs (classic_group.py, one
group's states and transitions; coordinator.py, the sans-I/O core over all groups; its asyncio
shell and wire handlers are replicad/leader/groups.py and group_wire.py), the durable
committed-offset store (offset_store.py), the rules for syncing a source group's offsets into
it (offset_sync.py), reading any cluster's groups and offsets (cluster_reader.py, which the
mirror's group sync shares), and the consumer protocol's payloads (consumer_protocol.py).
"""
