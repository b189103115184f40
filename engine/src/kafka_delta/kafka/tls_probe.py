"""What a broker's TLS listener says to a handshake of Python's own, to tell which of several
failures librdkafka reports in the same words.

librdkafka ends every TLS failure of a broker's certificate with OpenSSL's "certificate verify
failed", whether the certificate is signed by a CA the client does not trust or names another
host than the one connected to; and a plaintext client that reaches a TLS listener sees only a
connection closed at its first request, as it would from a broker that went away. The fix
differs each time (another CA file, another address, another ``security.protocol``), so the
sentence must say which. These probes ask the listener once more, with Python's ``ssl`` (the
same OpenSSL) and the client's own CA settings: the verification's error code says which check
failed, and a server that answers a TLS ClientHello with a TLS record speaks TLS. They run only
after a request failed, on the driver, and take at most a few seconds.
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

TIMEOUT_S = 2.0

# OpenSSL's verification errors that mean "the certificate does not name this host".
_NAME_MISMATCH = {62, 64}  # X509_V_ERR_HOSTNAME_MISMATCH, X509_V_ERR_IP_ADDRESS_MISMATCH
# ... and "no chain to a CA this client trusts".
_UNTRUSTED = {2, 18, 19, 20, 21}


@dataclass(frozen=True)
class CertificateVerdict:
    """Why the client did not accept the certificate a broker presented: ``kind`` is
    ``untrusted``, ``name`` (it does not name the host), ``other`` (expired, revoked, ...) or
    ``accepted``; ``reason`` OpenSSL's words."""

    kind: str
    reason: str


def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.strip().rpartition(":")
    return host.strip("[]"), int(port)


def _connect(address: str) -> socket.socket:
    host, port = split_address(address)
    return socket.create_connection((host, port), timeout=TIMEOUT_S)


def speaks_tls(address: str) -> bool | None:
    """Whether the listener at ``address`` answers a TLS ClientHello as a TLS server does (a
    ServerHello, or a TLS alert): True; False when it closes the connection or answers with
    something else (a Kafka listener without TLS); None when it cannot be reached."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        raw = _connect(address)
    except OSError:
        return None
    try:
        with context.wrap_socket(raw, do_handshake_on_connect=False) as conn:
            conn.do_handshake()
        return True
    except ssl.SSLError as exc:
        # A TLS server that refuses this client still answers in TLS: an alert.
        return "ALERT" in (exc.reason or "").upper() or "alert" in str(exc)
    except OSError:  # closed or reset at the first bytes: no TLS there
        return False
    finally:
        raw.close()


def _context(conf: Mapping[str, Any]) -> ssl.SSLContext:
    """The certificate checks the client makes, with its CA settings (librdkafka's names):
    ``ssl.ca.location`` (a file, a folder, or ``probe``), ``ssl.ca.pem``, else the system's CAs;
    the host name checked unless ``ssl.endpoint.identification.algorithm`` is ``none``."""
    location = str(conf.get("ssl.ca.location") or "")
    pem = conf.get("ssl.ca.pem")
    if location and location != "probe":
        from pathlib import Path

        folder = Path(location).is_dir()
        context = ssl.create_default_context(
            cafile=None if folder else location, capath=location if folder else None
        )
    elif pem:
        context = ssl.create_default_context(cadata=str(pem))
    else:
        context = ssl.create_default_context()
    algorithm = str(conf.get("ssl.endpoint.identification.algorithm", "https")).lower()
    context.check_hostname = algorithm == "https"
    return context


def verify_certificate(address: str, conf: Mapping[str, Any]) -> CertificateVerdict | None:
    """Whether the certificate the listener at ``address`` presents passes the checks the
    client makes with ``conf``; None when the listener cannot be asked."""
    host, _ = split_address(address)
    try:
        context = _context(conf)
        raw = _connect(address)
    except (OSError, ssl.SSLError, ValueError):
        return None
    try:
        with context.wrap_socket(raw, server_hostname=host, do_handshake_on_connect=False) as conn:
            conn.do_handshake()
        return CertificateVerdict("accepted", "")
    except ssl.SSLCertVerificationError as exc:
        code = exc.verify_code
        reason = exc.verify_message or str(exc)
        if code in _NAME_MISMATCH:
            return CertificateVerdict("name", reason)
        if code in _UNTRUSTED:
            return CertificateVerdict("untrusted", reason)
        return CertificateVerdict("other", reason)
    except (OSError, ssl.SSLError):
        return None
    finally:
        raw.close()
