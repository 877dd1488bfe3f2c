"""Deterministic simulation of the follower: the real core (replicad.follower's
PartitionTable and ActionPerformer) and the real log store against a simulated Kafka
cluster with simulated time and seeded faults. `python -m tools.sim --seed N` replays one
seed exactly; `--seeds N` runs many. See run.py for the events, invariants.py for what is
checked after each."""
