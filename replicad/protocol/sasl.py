"""What both ends of a SASL exchange share, written once.

The client side is `replicad.protocol.security` (towards the source's brokers), the server
side `replicad.leader.security` (`replicad serve`); TLS for both is replicad.config.tls.

- PLAIN's message is `authzid NUL authcid NUL passwd` (RFC 4616).
- SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802, RFC 7677) are computed by `scramp`; these are
  their hashes. Kafka hashes a name or password's UTF-8 bytes as they are, without
  SASLprep (RFC 4013): text that SASLprep would change can never prove itself to Kafka.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from replicad.config.model import SaslMechanism

PLAIN_SEPARATOR = "\0"
# The hash of each SCRAM mechanism, by hashlib's name.
_SCRAM_HASH_NAMES = {
    SaslMechanism.SCRAM_SHA_256: "sha256",
    SaslMechanism.SCRAM_SHA_512: "sha512",
}


def __getattr__(name: str) -> Any:
    """`SCRAM_HASHES` ({mechanism: hashlib constructor}), made on first use: hashlib loads
    OpenSSL's libcrypto (3.7 MiB of RSS), which a follower without SCRAM or TLS never
    needs (issue 32's memory at 10,000 partitions; replicad/startup.py's keep_tls_out)."""
    if name == "SCRAM_HASHES":
        import hashlib

        hashes: dict[SaslMechanism, Callable[..., Any]] = {
            mechanism: getattr(hashlib, hash_name)
            for mechanism, hash_name in _SCRAM_HASH_NAMES.items()
        }
        globals()[name] = hashes
        return hashes
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
