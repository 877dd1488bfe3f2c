"""replicad/records/crc.py: the crc32c library's C function, loaded without its package's
start-up (importlib.metadata), and the same checksum as the library's."""

from __future__ import annotations

import os
import subprocess
import sys

import crc32c as library
import pytest

from replicad.records import crc
from replicad.records.crc import crc32c

# RFC 3720 (iSCSI), B.4: the CRC32C of "123456789".
CHECK_VALUE = 0xE3069283


def test_the_checksum_is_crc32c_the_librarys_for_any_buffer():
    assert crc32c(b"123456789") == CHECK_VALUE
    data = os.urandom(70_001)
    view = memoryview(data)
    for piece in (b"", data, bytearray(data), view[1:], view[13:65_549]):
        assert crc32c(piece) == library.crc32c(piece)
    # Continued from an earlier value, as the library allows.
    assert crc32c(view[100:], crc32c(view[:100])) == library.crc32c(data)


def test_loading_it_reads_no_package_metadata():
    # The library's own `import crc32c` imports importlib.metadata for its version string.
    code = (
        "import sys; from replicad.records.crc import crc32c; "
        "print(crc32c(b'123456789'), 'importlib.metadata' in sys.modules, 'crc32c' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    ).stdout.split()
    assert out == [str(CHECK_VALUE), "False", "False"]


@pytest.mark.parametrize(
    "found",
    # SystemError: what an extension module raises when its init fails in a layout it
    # was not built for.
    [None, ImportError("moved"), OSError("unreadable"), SystemError("init failed")],
)
def test_an_extension_not_found_alone_falls_back_to_the_package(monkeypatch, found):
    # The library may move or rename its C extension: the package's own function is used.
    def load():
        if isinstance(found, Exception):
            raise found
        return found

    monkeypatch.setattr(crc, "_load_extension", load)
    function = crc._crc32c_function()
    assert function is library.crc32c
    assert function(b"123456789") == CHECK_VALUE
