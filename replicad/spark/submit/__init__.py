"""spark-submit's entry program lives here, alone in its directory (see replicad_pipeline.py)."""

from __future__ import annotations

from pathlib import Path


def submit_script() -> Path:
    """The file to give spark-submit as its program: `spark-submit ... <this> verify DIR`."""
    return Path(__file__).with_name("replicad_pipeline.py")
