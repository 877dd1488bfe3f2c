"""CRC32C (Castagnoli), the checksum of every magic 2 record batch: the `crc32c` library's
C function, loaded without the library's package.

`import crc32c` runs the package's `__init__`, which reads its own version through
`importlib.metadata` (and with it `email`, `zipfile`, `csv` and the scan of every installed
distribution): about 70 ms of CPU and 4 MiB of RSS on every start of every replicad
process, for a version string nothing here reads (issue 32: start-up is most of a short
run's CPU). The C extension `crc32c._crc32c` needs nothing of its package, so it is loaded
from the package's directory alone. Where that fails (a layout the library may change),
the package is imported as usual: slower to start, the same function.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

_EXTENSION = "crc32c._crc32c"


def _load_extension() -> Any | None:
    """The loaded `crc32c._crc32c`, or None where it cannot be found alone."""
    loaded = sys.modules.get(_EXTENSION)
    if loaded is not None:
        return loaded
    package = importlib.util.find_spec("crc32c")  # finds, does not run, the package
    if package is None or not package.submodule_search_locations:
        return None
    for directory in package.submodule_search_locations:
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            path = Path(directory) / f"_crc32c{suffix}"
            if path.is_file():
                loader = importlib.machinery.ExtensionFileLoader(_EXTENSION, str(path))
                spec = importlib.util.spec_from_file_location(_EXTENSION, path, loader=loader)
                if spec is None:
                    return None
                module = importlib.util.module_from_spec(spec)
                loader.exec_module(module)
                # The package, if imported later, finds its extension loaded already.
                sys.modules[_EXTENSION] = module
                return module
    return None


def _crc32c_function() -> Callable[..., int]:
    try:
        extension = _load_extension()
    except (ImportError, OSError, SystemError):  # SystemError: an extension's failed init
        extension = None
    if extension is not None and callable(getattr(extension, "crc32c", None)):
        return extension.crc32c  # type: ignore[no-any-return]
    from crc32c import crc32c as packaged

    return packaged


# crc32c(data, value=0) -> int: data any bytes-like object (memoryview slices included).
crc32c: Callable[..., int] = _crc32c_function()
