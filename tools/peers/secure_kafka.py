"""A real Apache Kafka broker with TLS and SASL listeners, for security tests.

`SecureKafkaBroker` is a `KafkaBroker` with, besides its PLAINTEXT listener (which the
harness and the test's producers and admin keep using), three more on 127.0.0.1:

    SASL_SSL        PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512 over TLS   (`sasl_ssl_bootstrap`)
    SSL             TLS with client certificates required (mTLS)       (`ssl_bootstrap`)
    SASL_PLAINTEXT  the same SASL mechanisms without TLS               (`sasl_plaintext_bootstrap`)

Its certificate comes from `tools.peers.pki` (keystore PKCS#12, truststore the test CA as
PEM). `users` (name -> password) become SCRAM-SHA-256 and -512 credentials at format time
(`kafka-storage format --add-scram`) and PLAIN users of the SASL listeners' JAAS config,
so they work from the broker's first second. Ports are picked at the first start and kept.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tools.peers.kafka import STORAGE_TOOL, KafkaBroker, _new_cluster_id, run_kafka_class
from tools.peers.pki import Pki
from tools.peers.process import LOOPBACK, free_port

SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
SCRAM_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")
SECURE_LISTENERS = ("SASL_SSL", "SSL", "SASL_PLAINTEXT")
_PLAIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"
_SCRAM_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule"


def _jaas_quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


class SecureKafkaBroker(KafkaBroker):
    def __init__(
        self,
        workdir: Path,
        *,
        pki: Pki,
        users: Mapping[str, str],
        broker_config: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> None:
        for name, password in users.items():
            # Kafka's --add-scram syntax has no quoting for these.
            if any(c in name + password for c in ",=[]\"'"):
                raise ValueError(f"user {name!r}: keep names and passwords to plain characters")
        self.pki = pki
        self.users = dict(users)
        self._secure_ports: dict[str, int] = {}
        self._ports_of: tuple[int | None, int | None] = (None, None)
        super().__init__(workdir, broker_config=broker_config, **kwargs)

    # -- addresses -------------------------------------------------------------------

    def listener_bootstrap(self, listener: str) -> str:
        if listener not in self._secure_ports:
            raise RuntimeError(f"the broker has not been started yet: no {listener} port")
        return f"{LOOPBACK}:{self._secure_ports[listener]}"

    @property
    def sasl_ssl_bootstrap(self) -> str:
        return self.listener_bootstrap("SASL_SSL")

    @property
    def ssl_bootstrap(self) -> str:
        return self.listener_bootstrap("SSL")

    @property
    def sasl_plaintext_bootstrap(self) -> str:
        return self.listener_bootstrap("SASL_PLAINTEXT")

    # -- configuration ---------------------------------------------------------------

    def _write_config(self) -> None:
        # New main ports (the harness's retry after a port was taken): new ones here too.
        if self._ports_of != (self.port, self._controller_port):
            self._secure_ports = {}
            self._ports_of = (self.port, self._controller_port)
        if not self._secure_ports:
            taken = {self.port, self._controller_port}
            for listener in SECURE_LISTENERS:
                port = free_port()
                while port in taken:
                    port = free_port()
                taken.add(port)
                self._secure_ports[listener] = port
        self._config.update(self._security_settings())
        super()._write_config()

    def _security_settings(self) -> dict[str, str]:
        secure = [f"{name}://{LOOPBACK}:{port}" for name, port in self._secure_ports.items()]
        plain_users = " ".join(
            f"user_{name}={_jaas_quote(password)}" for name, password in self.users.items()
        )
        settings = {
            "listeners": ",".join(
                [
                    f"PLAINTEXT://{LOOPBACK}:{self.port}",
                    f"CONTROLLER://{LOOPBACK}:{self._controller_port}",
                    *secure,
                ]
            ),
            "advertised.listeners": ",".join([f"PLAINTEXT://{LOOPBACK}:{self.port}", *secure]),
            "listener.security.protocol.map": (
                "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SASL_SSL:SASL_SSL,SSL:SSL,"
                "SASL_PLAINTEXT:SASL_PLAINTEXT"
            ),
            "sasl.enabled.mechanisms": ",".join(SASL_MECHANISMS),
            "ssl.keystore.type": "PKCS12",
            "ssl.keystore.location": str(self.pki.broker_keystore),
            "ssl.keystore.password": self.pki.keystore_password,
            "ssl.key.password": self.pki.keystore_password,
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(self.pki.ca),
            "listener.name.ssl.ssl.client.auth": "required",
        }
        for listener in ("sasl_ssl", "sasl_plaintext"):
            prefix = f"listener.name.{listener}"
            plain = f"{_PLAIN_MODULE} required {plain_users};"
            settings[f"{prefix}.plain.sasl.jaas.config"] = plain
            for mechanism in SCRAM_MECHANISMS:
                settings[f"{prefix}.{mechanism.lower()}.sasl.jaas.config"] = (
                    f"{_SCRAM_MODULE} required;"
                )
        return settings

    def _format_storage(self) -> None:
        scram = [
            arg
            for name, password in self.users.items()
            for mechanism in SCRAM_MECHANISMS
            for arg in ("--add-scram", f"{mechanism}=[name={name},password={password}]")
        ]
        run_kafka_class(
            STORAGE_TOOL,
            "format",
            "--cluster-id",
            _new_cluster_id(),
            "--config",
            str(self.workdir / "server.properties"),
            *scram,
            timeout_s=120,
        )
        self._formatted = True
