"""What both ends of a connection share about TLS and SASL, written once.

The client side is `replicad.protocol.security` (towards the source's brokers), the server
side `replicad.leader.security` (`replicad serve`). Both keep these rules:

- TLS 1.2 is the floor, either way.
- A private key's password is always answered by a callback, even when there is none
  (then ""): without one OpenSSL would prompt on the terminal of a daemon.
- PLAIN's message is `authzid NUL authcid NUL passwd` (RFC 4616).
- SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802, RFC 7677) are computed by `scramp`; these are
  their hashes. Kafka hashes a name or password's UTF-8 bytes as they are, without
  SASLprep (RFC 4013): text that SASLprep would change can never prove itself to Kafka.
"""

from __future__ import annotations

import hashlib
import ssl
from collections.abc import Callable
from typing import Any

from scramp import ScramException
from scramp.utils import saslprep

from replicad.config.model import SaslMechanism, Secret

MINIMUM_TLS = ssl.TLSVersion.TLSv1_2
PLAIN_SEPARATOR = "\0"
SCRAM_HASHES: dict[SaslMechanism, Callable[..., Any]] = {
    SaslMechanism.SCRAM_SHA_256: hashlib.sha256,
    SaslMechanism.SCRAM_SHA_512: hashlib.sha512,
}


def tls_context(*, server: bool) -> ssl.SSLContext:
    """A server's or a client's context, at the TLS floor."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if server else ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = MINIMUM_TLS
    return context


def key_password(
    secret: Secret | None, asked: Callable[[], None] | None = None
) -> Callable[[], str]:
    """The password callback for `load_cert_chain` ("" when there is no secret);
    `asked` is told when OpenSSL needed it (the key is encrypted)."""

    def answer() -> str:
        if asked is not None:
            asked()
        return secret.reveal() if secret is not None else ""

    return answer


def ssl_reason(error: ssl.SSLError) -> str:
    """OpenSSL's reason for a failure, readable: "certificate verify failed"."""
    return str(error.reason or error.strerror or error).replace("_", " ").lower()


def refuse_saslprep_changes(**texts: str) -> None:
    """ScramException naming the first of `texts` (e.g. username=..., password=...) that
    SASLprep changes: Kafka would hash it unchanged and the proof could never match."""
    for what, text in texts.items():
        if saslprep(text) != text:
            raise ScramException(
                f"the {what} changes under SASLprep (non-ASCII spaces, ligatures, "
                "soft hyphens...), which Kafka does not apply"
            )
