"""Credentials for a secured Flower deployment: a CA, the SuperLink's certificate, node keys and the roster.

    python credentials.py OUT NUM_AGENTS [EXTRA_NAME ...] [--address HOST ...] [--days N]

The demo (``run_demo.sh``) runs it for 127.0.0.1; a team can run it for its own
SuperLink (``--address superlink.example.org``, repeated for each name or IP the
nodes use) when it has no CA of its own (docs/flower.md walks through it).
Writes into OUT (private keys mode 0600):

==========================  ===============================================================
``ca.crt``                  a self-signed CA (PEM): the SuperLink's ``--ssl-ca-certfile``, the
                            SuperNodes' ``--root-certificates``, the ``flwr`` CLI's
                            ``root-certificates``. Its private key is not kept.
``server.crt``,             the SuperLink's TLS certificate and key (PEM; SAN: IP 127.0.0.1,
``server.key``              IP ::1, DNS localhost and each ``--address``): ``--ssl-certfile`` /
                            ``--ssl-keyfile``
``node-<n>``,               SuperNode ``n``'s key pair (EC P-384, OpenSSH format): the private
``node-<n>.pub``            key for ``--auth-supernode-private-key``, the public key for
                            ``flwr supernode register``
``roster.json``             ``{n: public key}``: the ServerApp's agent roster (``FBO_AGENT_ROSTER``)
``<name>``, ``<name>.pub``  an extra key pair per EXTRA_NAME (e.g. ``rogue``), not on the roster
==========================  ===============================================================

The SuperLink's own SuperExec connects to ``127.0.0.1``, so the server
certificate must name that address (a DNS name alone fails the handshake).
Needs ``cryptography`` (installed with ``flwr``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import ipaddress
import json
import os
import sys
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

PEM = serialization.Encoding.PEM


def _write(path: Path, data: bytes, private: bool = False) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)


def tls(out: Path, days: int = 2, addresses: tuple[str, ...] = ()) -> None:
    """A CA and a server certificate for 127.0.0.1 / localhost and ``addresses`` (host names or IPs),
    valid for ``days`` days."""
    now = dt.datetime.now(dt.timezone.utc)
    start, end = now - dt.timedelta(minutes=5), now + dt.timedelta(days=days)  # a little clock skew is fine
    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fbo-torch demo CA")])
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    usage = dict(
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        encipher_only=False,
        decipher_only=False,
    )
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, key_agreement=False, **usage),
            critical=True,
        )
        .add_extension(ca_ski, critical=False)
        .sign(ca_key, hashes.SHA384())
    )
    key = ec.generate_private_key(ec.SECP384R1())
    names = [
        x509.DNSName("localhost"),
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.IPAddress(ipaddress.ip_address("::1")),
    ]
    for address in addresses:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(address)))
        except ValueError:
            names.append(x509.DNSName(address))
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(digital_signature=True, key_cert_sign=False, crl_sign=False, key_agreement=True, **usage),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
        .sign(ca_key, hashes.SHA384())
    )
    _write(out / "ca.crt", ca.public_bytes(PEM))
    _write(out / "server.crt", cert.public_bytes(PEM))
    _write(
        out / "server.key",
        key.private_bytes(PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
        private=True,
    )


def node_key(out: Path, name: str) -> str:
    """A SuperNode key pair ``name`` / ``name.pub`` (EC P-384, OpenSSH); returns the public key line."""
    key = ec.generate_private_key(ec.SECP384R1())
    _write(
        out / name,
        key.private_bytes(PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()),
        private=True,
    )
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    _write(out / f"{name}.pub", public + b"\n")
    return public.decode()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="credentials.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="the folder to write into")
    parser.add_argument("num_agents", type=int, help="key pairs node-0 ... node-<N-1>, on the roster")
    parser.add_argument("extra", nargs="*", help="more key pairs, not on the roster (e.g. rogue)")
    parser.add_argument("--address", action="append", default=[], help="a name or IP of the SuperLink (repeat)")
    parser.add_argument("--days", type=int, default=2, help="validity of the certificates (default 2)")
    args = parser.parse_args(argv)
    if args.num_agents < 1 or args.days < 1:
        parser.error("NUM_AGENTS and --days must be >= 1")
    out, n = args.out, args.num_agents
    out.mkdir(mode=0o700, parents=True, exist_ok=True)
    tls(out, args.days, tuple(args.address))
    roster = {str(i): node_key(out, f"node-{i}") for i in range(n)}
    for name in args.extra:
        node_key(out, name)
    _write(out / "roster.json", json.dumps(roster, indent=1).encode())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
