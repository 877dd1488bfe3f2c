"""`python -m replicad.spark.submit` prints the path of spark-submit's program file."""

from __future__ import annotations

from replicad.spark.submit import submit_script

print(submit_script())
