"""What both ends of a SASL exchange share, written once.

The client side is `replicad.protocol.security` (towards the source's brokers), the server
side `replicad.leader.security` (`replicad serve`); TLS for both is replicad.config.tls.

- PLAIN's message is `authzid NUL authcid NUL passwd` (RFC 4616).
- SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802, RFC 7677) are computed by `scramp`; these are
  their hashes. Kafka hashes a name or password's UTF-8 bytes as they are, without
  SASLprep (RFC 4013): text that SASLprep would change can never prove itself to Kafka.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

from replicad.config.model import SaslMechanism

PLAIN_SEPARATOR = "\0"
SCRAM_HASHES: dict[SaslMechanism, Callable[..., Any]] = {
    SaslMechanism.SCRAM_SHA_256: hashlib.sha256,
    SaslMechanism.SCRAM_SHA_512: hashlib.sha512,
}


def refuse_saslprep_changes(**texts: str) -> None:
    """ScramException naming the first of `texts` (e.g. username=..., password=...) that
    SASLprep changes: Kafka would hash it unchanged and the proof could never match."""
    # scramp (with asn1crypto, ~6 MiB) is loaded only where SCRAM is used.
    from scramp import ScramException
    from scramp.utils import saslprep

    for what, text in texts.items():
        if saslprep(text) != text:
            raise ScramException(
                f"the {what} changes under SASLprep (non-ASCII spaces, ligatures, "
                "soft hyphens...), which Kafka does not apply"
            )
