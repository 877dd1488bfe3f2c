"""kcat, the librdkafka command-line client (Debian package), as a real peer.

Fetched by tools/kcat.sh (run by `make test`): installed system-wide when root, else
unpacked into .cache/kcat without root.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from tools.peers.process import PeerError, PeerNotInstalledError

UNPACKED = Path(__file__).resolve().parents[2] / ".cache" / "kcat" / "bin" / "kcat"


def kcat_binary() -> str:
    path = shutil.which("kcat")
    if path is not None:
        return path
    if UNPACKED.is_file():
        return str(UNPACKED)
    raise PeerNotInstalledError("kcat is not installed: run `tools/kcat.sh fetch` (make test does)")


def run_kcat(
    *args: str, timeout_s: float = 60, check: bool = True
) -> subprocess.CompletedProcess[bytes]:
    """Run kcat with `args`; stdout as bytes (records may be binary), stderr kept for errors."""
    try:
        result = subprocess.run(
            [kcat_binary(), *args], capture_output=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise PeerError(f"kcat {' '.join(args)} did not finish within {timeout_s:.0f} s") from exc
    if check and result.returncode != 0:
        raise PeerError(
            f"kcat {' '.join(args)} exited with {result.returncode}: "
            f"{result.stderr.decode(errors='replace').strip()[-2000:]}"
        )
    return result
