"""Certificates for a Kafka broker on 127.0.0.1 that speaks TLS, made when a test needs them
and never kept: a CA, the broker's certificate signed by it (naming ``127.0.0.1`` only, so a
client that connects to ``localhost`` meets a certificate that does not name its host), a
client certificate for mutual TLS, and a second CA that signed nothing of the broker's (a
client that trusts only it does not trust the broker). Each is written in the forms both
Kafka clients read: PEM for librdkafka (``ssl.ca.location``, ``ssl.certificate.location``,
``ssl.key.location`` with ``ssl.key.password``), PKCS12 stores for the Java client and the
broker (``ssl.truststore.location``, ``ssl.keystore.location`` with their passwords).

Made with ``openssl`` (keys, requests, signatures, the key stores) and the JDK's ``keytool``
(the trust stores: Java takes a certificate in a PKCS12 store as trusted only with the
attribute keytool writes). The passwords are drawn anew each time, so none is ever the same
twice or written into the repository.

    >>> tls = make_certificates(tmp_path)  # doctest: +SKIP
    >>> tls.listener_properties(client_auth="required")["ssl.keystore.location"]  # doctest: +SKIP
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from kafka_delta_dev.children import HOST

# Long enough for any test session; a certificate is made for one.
DAYS = 2


class CertificateError(RuntimeError):
    """openssl or keytool is missing, or refused to make a file."""


@dataclass(frozen=True)
class Certificates:
    """The files of one test's TLS set-up (all in ``folder``) and their passwords."""

    folder: Path
    # The CA that signed the broker's and the client's certificates, and one that signed
    # neither (PEM, for librdkafka's ssl.ca.location).
    ca: Path
    other_ca: Path
    # The broker's key store (its key and certificate chain) and trust store (the CA, which
    # client certificates must be signed by), PKCS12.
    broker_keystore: Path
    broker_truststore: Path
    # The client's certificate and its key, encrypted with key_password (PEM, for librdkafka),
    # and the same pair in a PKCS12 key store whose password is key_password (for the Java
    # client: PKCS12 keeps one password for the store and its key).
    client_certificate: Path
    client_key: Path
    client_keystore: Path
    # The same key unencrypted, for settings that take a key inline (ssl.key.pem,
    # ssl.keystore.key): a secret in itself.
    client_plain_key: Path
    # The CA, and the CA that signed nothing, as PKCS12 trust stores for the Java client.
    client_truststore: Path
    other_truststore: Path
    # The subject's common name of the client certificate: the principal a broker mapping
    # ``CN=...`` to the name (``ssl.principal.mapping.rules``) gives a client that shows it.
    client_name: str
    store_password: str
    key_password: str
    truststore_password: str

    def listener_properties(self, client_auth: str = "none") -> dict[str, str]:
        """A TLS listener's settings (without ``listener.name.<name>.``): the broker's key
        store, and with ``client_auth`` ``required`` the trust store client certificates must
        chain to. Principals of client certificates are their common names."""
        properties = {
            "ssl.keystore.type": "PKCS12",
            "ssl.keystore.location": str(self.broker_keystore),
            "ssl.keystore.password": self.store_password,
            "ssl.key.password": self.store_password,
            "ssl.client.auth": client_auth,
        }
        if client_auth != "none":
            properties |= {
                "ssl.truststore.type": "PKCS12",
                "ssl.truststore.location": str(self.broker_truststore),
                "ssl.truststore.password": self.store_password,
                "ssl.principal.mapping.rules": "RULE:^CN=([^,]+).*$/$1/,DEFAULT",
            }
        return properties


def _tool(name: str) -> str:
    if name == "keytool" and os.environ.get("JAVA_HOME"):
        candidate = Path(os.environ["JAVA_HOME"]) / "bin" / "keytool"
        if candidate.exists():
            return str(candidate)
    found = shutil.which(name)
    if found is None:
        raise CertificateError(f"{name} is not on PATH: it makes the tests' certificates")
    return found


def _run(*command: str, cwd: Path) -> None:
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise CertificateError(
            f"{Path(command[0]).name} {command[1]} failed: {(done.stderr or done.stdout).strip()}"
        )


def _key_and_request(openssl: str, folder: Path, name: str, subject: str) -> None:
    # EC P-256: both clients and the broker take it, and it is made in milliseconds.
    _run(
        openssl, "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
        "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subject,
        cwd=folder,
    )  # fmt: skip


def _ca(openssl: str, folder: Path, name: str, subject: str) -> None:
    _key_and_request(openssl, folder, name, subject)
    (folder / f"{name}.ext").write_text(
        "basicConstraints = critical, CA:TRUE\nkeyUsage = critical, keyCertSign, cRLSign\n"
    )
    _run(
        openssl, "x509", "-req", "-in", f"{name}.csr", "-signkey", f"{name}.key",
        "-days", str(DAYS), "-extfile", f"{name}.ext", "-out", f"{name}.pem",
        cwd=folder,
    )  # fmt: skip


def _signed(openssl: str, folder: Path, name: str, subject: str, extensions: str) -> None:
    _key_and_request(openssl, folder, name, subject)
    (folder / f"{name}.ext").write_text(extensions)
    _run(
        openssl, "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-days", str(DAYS), "-extfile", f"{name}.ext", "-out", f"{name}.pem",
        cwd=folder,
    )  # fmt: skip


def _keystore(openssl: str, folder: Path, name: str, password: str) -> Path:
    # The key, its certificate and the CA's, as Java and the broker read a key store.
    _run(
        openssl, "pkcs12", "-export", "-in", f"{name}.pem", "-inkey", f"{name}.key",
        "-certfile", "ca.pem", "-name", name, "-out", f"{name}.keystore.p12",
        "-passout", f"pass:{password}",
        cwd=folder,
    )  # fmt: skip
    return folder / f"{name}.keystore.p12"


def _truststore(keytool: str, folder: Path, ca: str, name: str, password: str) -> Path:
    _run(
        keytool, "-importcert", "-noprompt", "-alias", "ca", "-file", ca,
        "-keystore", f"{name}.p12", "-storetype", "PKCS12", "-storepass", password,
        cwd=folder,
    )  # fmt: skip
    return folder / f"{name}.p12"


def make_certificates(folder: Path, client_name: str = "tls-client") -> Certificates:
    """Every file of :class:`Certificates` in ``folder`` (created), with new passwords."""
    openssl, keytool = _tool("openssl"), _tool("keytool")
    folder.mkdir(parents=True, exist_ok=True)
    store_password, key_password, truststore_password = (
        f"{what}-{secrets.token_urlsafe(12)}" for what in ("store", "key", "trust")
    )
    _ca(openssl, folder, "ca", "/CN=kafka-delta test CA")
    _ca(openssl, folder, "other-ca", "/CN=kafka-delta test CA that signed nothing")
    _signed(
        openssl,
        folder,
        "broker",
        f"/CN={HOST}",
        f"subjectAltName = IP:{HOST}\nextendedKeyUsage = serverAuth, clientAuth\n",
    )
    _signed(openssl, folder, "client", f"/CN={client_name}", "extendedKeyUsage = clientAuth\n")
    broker_keystore = _keystore(openssl, folder, "broker", store_password)
    client_keystore = _keystore(openssl, folder, "client", key_password)
    # The client's key for librdkafka: PKCS#8 PEM encrypted with the key's password.
    _run(
        openssl, "pkcs8", "-topk8", "-v2", "aes-256-cbc", "-in", "client.key",
        "-out", "client.encrypted.key", "-passout", f"pass:{key_password}",
        cwd=folder,
    )  # fmt: skip
    return Certificates(
        folder=folder,
        ca=folder / "ca.pem",
        other_ca=folder / "other-ca.pem",
        broker_keystore=broker_keystore,
        broker_truststore=_truststore(
            keytool, folder, "ca.pem", "broker.truststore", store_password
        ),
        client_certificate=folder / "client.pem",
        client_key=folder / "client.encrypted.key",
        client_keystore=client_keystore,
        client_plain_key=folder / "client.key",
        client_truststore=_truststore(
            keytool, folder, "ca.pem", "client.truststore", truststore_password
        ),
        other_truststore=_truststore(
            keytool, folder, "other-ca.pem", "other.truststore", truststore_password
        ),
        client_name=client_name,
        store_password=store_password,
        key_password=key_password,
        truststore_password=truststore_password,
    )
