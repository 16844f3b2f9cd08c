"""TLS on 127.0.0.1 in front of a plain HTTP server, with a CA made for it.

    from tls_proxy import TLSProxy, make_ca_and_server
    bundle, cert, key = make_ca_and_server(folder, "a")
    with TLSProxy("http://127.0.0.1:5000", cert, key) as proxy:
        ...  # AWS_CA_BUNDLE=bundle, S3Store(..., endpoint_url=proxy.url)

The S3 emulators here speak plain HTTP, and real S3 speaks HTTPS: with this in front of one
(or of bench/latency_proxy.py, which keeps connections alive as S3 does), a client pays for
TLS what it pays on real S3: the handshakes and the loading of its CA bundle.
tests/s3/test_tls.py and bench/tls_startup.py use it.
"""

from __future__ import annotations

import datetime
import ipaddress
import select
import socket
import socketserver
import ssl
from pathlib import Path
from urllib.parse import urlsplit

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from latency_proxy import Serving


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def make_ca_and_server(folder: Path, tag: str) -> tuple[Path, Path, Path]:
    """A CA (its certificate as a bundle file) and a server certificate for 127.0.0.1."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name(f"alpineagents tests CA {tag}"))
        .issuer_name(_name(f"alpineagents tests CA {tag}"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    server = (
        x509.CertificateBuilder()
        .subject_name(_name("127.0.0.1"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    bundle = folder / f"ca-{tag}.pem"
    bundle.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    cert = folder / f"server-{tag}.pem"
    cert.write_bytes(server.public_bytes(serialization.Encoding.PEM))
    key_file = folder / f"server-{tag}.key"
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return bundle, cert, key_file


class TLSProxy(Serving, socketserver.ThreadingTCPServer):
    """TLS on 127.0.0.1 in front of a plain HTTP server: each connection piped to it."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, upstream: str, cert: Path, key: Path):
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(cert, key)
        self.handshakes = 0  # completed: a client that refused the certificate is not counted
        socketserver.ThreadingTCPServer.__init__(self, ("127.0.0.1", 0), _Pipe)
        Serving.__init__(self, self)  # its own server; Serving's __enter__ and __exit__

    @property
    def url(self) -> str:
        """The proxy's endpoint URL, for ``S3Store(endpoint_url=...)``."""
        return f"https://127.0.0.1:{self.server_address[1]}"


class _Pipe(socketserver.BaseRequestHandler):
    server: TLSProxy

    def handle(self) -> None:
        try:
            tls = self.server.context.wrap_socket(self.request, server_side=True)
        except (ssl.SSLError, OSError):
            return  # a client that refused our certificate
        self.server.handshakes += 1
        with tls, socket.create_connection(self.server.upstream) as plain:
            ends = {tls: plain, plain: tls}
            while True:
                ready = [tls] if tls.pending() else select.select(list(ends), [], [], 30)[0]
                if not ready:
                    return
                for end in ready:
                    try:
                        data = end.recv(65536)
                    except (ssl.SSLError, OSError):
                        return
                    if not data:
                        return
                    ends[end].sendall(data)


__all__ = ["TLSProxy", "make_ca_and_server"]
