"""`python -m tools.logdata`: the long crash-test run (see tools/logdata/crash.py)."""

import sys

from tools.logdata.crash import main

sys.exit(main())
