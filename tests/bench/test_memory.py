"""tools/bench/memory.py's step explainer: a large buffer allocated between two samples of
a process shows as a new anonymous mapping of its size (the bench itself needs a 3-node
Kafka cluster: tests/follower/test_memory_10k.py runs it)."""

from __future__ import annotations

import subprocess
import sys

from tools.bench.memory import MIB, anonymous_mappings, explain_step

_CHILD = """
import sys
sys.stdout.write("ready\\n"); sys.stdout.flush()
sys.stdin.readline()
held = bytearray(24 << 20)
sys.stdout.write("allocated\\n"); sys.stdout.flush()
sys.stdin.readline()
"""


def test_a_buffer_allocated_between_samples_is_named_as_a_new_mapping_of_its_size() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert child.stdin is not None and child.stdout is not None
    try:
        assert child.stdout.readline() == "ready\n"
        before = anonymous_mappings(child.pid)
        assert any(key.endswith("[heap]") for key in before)
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline() == "allocated\n"
        after, said = explain_step(child.pid, before, dump=False)
        new = [size for key, size in after.items() if key not in before]
        assert any(size >= 24 * MIB for size in new), said
        assert "other anonymous mappings +24.0 MiB" in said
    finally:
        child.stdin.close()
        child.wait(timeout=60)
