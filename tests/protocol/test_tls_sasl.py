"""replicad/protocol/tls_sasl.py: the TLS and SASL rules client and server share."""

from __future__ import annotations

import ssl

import pytest
from scramp import ScramException

from replicad.config.model import Secret
from replicad.protocol.tls_sasl import (
    MINIMUM_TLS,
    key_password,
    refuse_saslprep_changes,
    ssl_reason,
    tls_context,
)


@pytest.mark.parametrize("server", [True, False])
def test_both_ends_refuse_below_tls_1_2(server: bool) -> None:
    context = tls_context(server=server)
    assert context.minimum_version == MINIMUM_TLS == ssl.TLSVersion.TLSv1_2
    assert context.protocol == (ssl.PROTOCOL_TLS_SERVER if server else ssl.PROTOCOL_TLS_CLIENT)


def test_the_key_password_is_always_answered_and_reported_asked() -> None:
    asked: list[bool] = []
    assert key_password(None, asked=lambda: asked.append(True))() == ""
    assert asked == [True]
    assert key_password(Secret("test", "s3cret"))() == "s3cret"


def test_text_saslprep_would_change_is_refused_by_name() -> None:
    refuse_saslprep_changes(username="replicad", password="plain ascii")
    with pytest.raises(ScramException, match="the password changes under SASLprep"):
        refuse_saslprep_changes(username="replicad", password="no\u00a0break")


def test_ssl_reasons_read_as_words() -> None:
    error = ssl.SSLError(1, "x")
    error.reason = "CERTIFICATE_VERIFY_FAILED"
    assert ssl_reason(error) == "certificate verify failed"
