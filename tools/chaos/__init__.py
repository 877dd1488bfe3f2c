"""The fault harness: replicad as a black box under network, process and disk faults.

- `frames`: Kafka frames as the proxy sees them (sans-I/O): request heads, Metadata
  rewriting, record batch positions in Fetch responses, checksum-covered damage.
- `proxy`: `ChaosProxy`, an asyncio TCP proxy in a thread that cuts, stalls, delays,
  truncates and flips bytes between replicad and a broker.
- `wire_data`: kio-built responses of any version, for tests and fuzz seeds.
"""
