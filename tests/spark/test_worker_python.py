"""The local workers' Python (worker_python.py): PySpark from the installed package, ahead of
the pyspark.zip Spark puts first on a worker's path, and the caller's path kept after it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from replicad.spark.worker_python import pyspark_home, worker_python


def test_workers_import_the_installed_pyspark_ahead_of_sparks_zip(tmp_path):
    zips = sorted((pyspark_home() / "pyspark" / "python" / "lib").glob("*.zip"))
    assert any(z.name == "pyspark.zip" for z in zips)
    (tmp_path / "mine.py").write_text("NAME = 'mine'\n")
    # As Spark starts a worker: its zips first, then whatever PYTHONPATH the user had.
    path = os.pathsep.join([*map(str, zips), str(tmp_path)])
    result = subprocess.run(
        [worker_python(), "-c", "import mine, pyspark; print(pyspark.__file__, mine.NAME)"],
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        check=True,
    )
    module, name = result.stdout.split()
    assert Path(module) == pyspark_home() / "pyspark" / "__init__.py"
    assert name == "mine"
    assert os.access(worker_python(), os.X_OK) and worker_python() == worker_python()
