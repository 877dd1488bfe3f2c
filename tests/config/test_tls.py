"""replicad/config/tls.py: TLS contexts for both ends, from the config."""

from __future__ import annotations

import ssl

import pytest

from replicad.config.model import Secret
from replicad.config.tls import MINIMUM_TLS, password_callback, ssl_reason, tls_context


@pytest.mark.parametrize("server", [True, False])
def test_both_ends_refuse_below_tls_1_2(server: bool) -> None:
    context = tls_context(server=server)
    assert context.minimum_version == MINIMUM_TLS == ssl.TLSVersion.TLSv1_2
    assert context.protocol == (ssl.PROTOCOL_TLS_SERVER if server else ssl.PROTOCOL_TLS_CLIENT)


def test_the_key_password_is_always_answered_and_reported_asked() -> None:
    asked: list[bool] = []
    assert password_callback(None, asked=lambda: asked.append(True))() == ""
    assert asked == [True]
    assert password_callback(Secret("test", "s3cret"))() == "s3cret"


def test_ssl_reasons_read_as_words() -> None:
    error = ssl.SSLError(1, "x")
    error.reason = "CERTIFICATE_VERIFY_FAILED"
    assert ssl_reason(error) == "certificate verify failed"
