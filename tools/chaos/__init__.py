"""The fault harness: replicad as a black box under network, process and disk faults.

- `frames`: Kafka frames as the proxy sees them (sans-I/O): request heads, Metadata
  rewriting, record batch positions in Fetch responses, checksum-covered damage.
- `proxy`: `ChaosProxy`, an asyncio TCP proxy in a thread that cuts, stalls, delays,
  truncates and flips bytes between replicad and a broker.
- `wire_data`: kio-built responses of any version, for tests and fuzz seeds.
- `invariant`: the check every scenario ends with (byte-identical prefix of the source).
- `follower`: one replicad daemon seen from outside (CLI, status JSON, /proc, log).
- `load`: steady `produce_mixed` rounds in a thread. `evictor`: session-cache pressure
  (a privileged session evictor, competing kafka-python consumers).
- `disk`: a small tmpfs that fills up; a slow disk (LD_PRELOAD shim, slowdisk.c).
- `scenarios`: the fault scenarios and their results (`SCENARIOS`, sizes CI and FULL).
- `soak`: the long soak, faults by seed against one source; `soak_sources`: its sources
  (a Kafka broker, a three-node Kafka cluster, Tansu) and the faults each can have.
- `isolate`, `mutate`, `fuzz_targets`, `strategies`: fuzzing every decoder, each input in
  a forked child so a native abort is a finding.
"""
