"""The ceiling of a Python follower: the same bytes copied from a loopback socket to a file.

No protocol, no CRC, no index: a sender process streams the topic's segment files over one
TCP connection on 127.0.0.1 with sendfile (as a broker does), and a plain Python receiver
copies them into one file with `recv_into` a reused buffer and `write`, unbuffered. What
replicad does on top of this (framing, validation, logs, indexes, checkpoints, asyncio) is
its cost; tools/bench/replicate reports replicad as a fraction of the receiver's rate.

    python -m tools.bench.ceiling send PORT_FILE FILE...   # listens, serves one connection
    python -m tools.bench.ceiling receive PORT OUT BYTES   # connects, copies BYTES into OUT
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

# The receive buffer: as large as replicad's largest fetch response frames are typical.
BUFFER_BYTES = 1024 * 1024
SENDFILE_CHUNK = 64 * 1024 * 1024


def send(port_file: str, files: list[str]) -> int:
    """Listen on a free loopback port (written to `port_file` once listening), send every
    file to the first connection, close."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        tmp = Path(port_file + ".tmp")
        tmp.write_text(str(server.getsockname()[1]))
        tmp.rename(port_file)
        conn, _ = server.accept()
        with conn:
            for name in files:
                with open(name, "rb") as f:
                    size = os.fstat(f.fileno()).st_size
                    offset = 0
                    while offset < size:
                        offset += os.sendfile(
                            conn.fileno(), f.fileno(), offset, min(SENDFILE_CHUNK, size - offset)
                        )
    return 0


def receive(port: int, out: str, expected: int) -> int:
    """Copy `expected` bytes from the sender into `out`."""
    buf = bytearray(BUFFER_BYTES)
    view = memoryview(buf)
    got = 0
    with (
        socket.create_connection(("127.0.0.1", port)) as conn,
        open(out, "wb", buffering=0) as f,
    ):
        while got < expected:
            n = conn.recv_into(buf)
            if not n:
                break
            f.write(view[:n])
            got += n
    if got != expected:
        print(f"received {got:,} bytes, expected {expected:,}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["send"]:
        return send(argv[1], argv[2:])
    if argv[:1] == ["receive"]:
        return receive(int(argv[1]), argv[2], int(argv[3]))
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
