"""replicad/protocol/sasl.py: the SASL rules client and server share."""

from __future__ import annotations

import pytest
from scramp import ScramException

from replicad.protocol.sasl import refuse_saslprep_changes


def test_text_saslprep_would_change_is_refused_by_name() -> None:
    refuse_saslprep_changes(username="replicad", password="plain ascii")
    with pytest.raises(ScramException, match="the password changes under SASLprep"):
        refuse_saslprep_changes(username="replicad", password="no\u00a0break")
