"""`replicad pipeline` jobs as spark-submit's program:

    spark-submit --master yarn --py-files replicad-0.1.0-py3-none-any.whl \
        "$(python -m replicad.spark.submit)" export /data/replicad --out hdfs:///replicad

spark-submit puts the program's directory first on sys.path, so this file has a directory
of its own: next to replicad.spark's modules (options, schema, files, ...) their names
would shadow other packages' top-level modules.
"""

from __future__ import annotations

import sys

from replicad.spark.pipeline import main

if __name__ == "__main__":
    sys.exit(main())
