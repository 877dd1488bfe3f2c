"""Consumer groups: the classic group coordinator `replicad serve` runs (coordinator.py, the
sans-I/O core; service.py, its asyncio shell; wire.py, the APIs on the wire), the durable
committed-offset store (store.py), and what `replicad run` reads from the source to keep
synced groups' offsets (cluster_reader.py, sync_plan.py, sync_loop.py).
"""
