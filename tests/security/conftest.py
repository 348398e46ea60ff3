"""Fixtures for the security tests: a throw-away PKI, tokens with roles, and the three servers.

Certificates and keys are made at test time with `cryptography` (nothing secret is committed):
a CA, a server certificate for 127.0.0.1/localhost signed by it, a client certificate signed by
it (mutual TLS), and a second, unrelated CA whose certificates must be refused.
"""

from __future__ import annotations

import dataclasses
import datetime
import ipaddress
import json
import pathlib

import pytest

from orrery.security import ENVS_WRITE, INTERNAL, READ, ClientSecurity, ServerSecurity, token_sha256

TOKENS = {  # name -> (token, roles)
    "writer": ("tok-writer-" + "w" * 32, [ENVS_WRITE, READ]),
    "reader": ("tok-reader-" + "r" * 32, [READ]),
    "internal": ("tok-internal-" + "i" * 32, [INTERNAL]),
}


@dataclasses.dataclass(frozen=True)
class Pki:
    ca: pathlib.Path
    server_cert: pathlib.Path
    server_key: pathlib.Path
    client_cert: pathlib.Path
    client_key: pathlib.Path
    other_ca: pathlib.Path
    other_client_cert: pathlib.Path
    other_client_key: pathlib.Path


def _key():
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1())


def _name(common_name: str):
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _certificate(subject: str, key, issuer: str, issuer_key, *, ca: bool, server: bool = False):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import ExtendedKeyUsageOID

    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (x509.CertificateBuilder().subject_name(_name(subject)).issuer_name(_name(issuer))
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(hours=1))
               .not_valid_after(now + datetime.timedelta(days=2))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if server:
        builder = builder.add_extension(x509.SubjectAlternativeName(
            [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        builder = builder.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
    elif not ca:
        builder = builder.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _write(folder: pathlib.Path, name: str, cert=None, key=None) -> pathlib.Path:
    from cryptography.hazmat.primitives import serialization

    path = folder / name
    if cert is not None:
        path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    else:
        path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
        path.chmod(0o600)
    return path


@pytest.fixture(scope="session")
def pki(tmp_path_factory) -> Pki:
    folder = tmp_path_factory.mktemp("pki")
    ca_key, other_key = _key(), _key()
    ca = _certificate("orrery test CA", ca_key, "orrery test CA", ca_key, ca=True)
    other = _certificate("someone else's CA", other_key, "someone else's CA", other_key, ca=True)
    server_key, client_key, other_client_key = _key(), _key(), _key()
    server = _certificate("127.0.0.1", server_key, "orrery test CA", ca_key, ca=False, server=True)
    client = _certificate("controller", client_key, "orrery test CA", ca_key, ca=False)
    other_client = _certificate("intruder", other_client_key, "someone else's CA", other_key, ca=False)
    return Pki(
        ca=_write(folder, "ca.pem", cert=ca), server_cert=_write(folder, "server.pem", cert=server),
        server_key=_write(folder, "server.key", key=server_key), client_cert=_write(folder, "client.pem", cert=client),
        client_key=_write(folder, "client.key", key=client_key), other_ca=_write(folder, "other-ca.pem", cert=other),
        other_client_cert=_write(folder, "other-client.pem", cert=other_client),
        other_client_key=_write(folder, "other-client.key", key=other_client_key))


@pytest.fixture(scope="session")
def tokens_file(tmp_path_factory) -> pathlib.Path:
    path = tmp_path_factory.mktemp("tokens") / "tokens.json"
    entries = [{"name": name, "sha256": token_sha256(token), "roles": roles} for name, (token, roles) in TOKENS.items()]
    path.write_text(json.dumps({"tokens": entries}))
    return path


@pytest.fixture(scope="session")
def token_files(tmp_path_factory) -> dict[str, pathlib.Path]:
    """name -> a file holding that token (how clients are given tokens)."""
    folder = tmp_path_factory.mktemp("client-tokens")
    files = {}
    for name, (token, _) in TOKENS.items():
        files[name] = folder / f"{name}.token"
        files[name].write_text(token + "\n")
    return files


@pytest.fixture(scope="session")
def tls_security(pki, tokens_file) -> ServerSecurity:
    return ServerSecurity(tls_cert=str(pki.server_cert), tls_key=str(pki.server_key), tokens_file=str(tokens_file))


def client_security(pki: Pki, token_file: pathlib.Path | None = None, **overrides) -> ClientSecurity:
    fields = dict(tls_ca=str(pki.ca), token_file=str(token_file) if token_file else "")
    fields.update(overrides)
    return ClientSecurity(**fields)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A tokenizer + tiny model folder (the rollout worker's tokenizer comes from here)."""
    from model.factory import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("security-model") / "tiny", vocab_size=300,
                           hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2)
