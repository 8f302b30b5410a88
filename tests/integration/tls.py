"""A throwaway CA and the certificates a secured local broker and its clients need, made with openssl (Debian's):
the broker's for 127.0.0.1 and localhost, a client's for mTLS, and a client certificate from another CA (which
the broker must refuse). Keys are unencrypted PKCS#8 PEM, which both Kafka's PEM stores and librdkafka read."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Pki:
    ca: Path
    broker_keystore: Path
    client_cert: Path
    client_key: Path
    stranger_ca: Path
    stranger_cert: Path
    stranger_key: Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _ca(folder: Path, name: str) -> None:
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-noenc", "-days", "2", "-subj", f"/CN={name}",
             "-keyout", f"{name}.key", "-out", f"{name}.pem", cwd=folder)  # fmt: skip


def _signed(folder: Path, name: str, ca: str, extensions: str) -> None:
    _openssl("req", "-newkey", "rsa:2048", "-noenc", "-subj", f"/CN={name}", "-keyout", f"{name}.key",
             "-out", f"{name}.csr", cwd=folder)  # fmt: skip
    (folder / f"{name}.ext").write_text(extensions + "\n")
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key", "-CAcreateserial",
             "-days", "2", "-out", f"{name}.pem", "-extfile", f"{name}.ext", cwd=folder)  # fmt: skip


def make_pki(folder: Path) -> Pki:
    assert shutil.which("openssl"), "openssl is needed to make the test certificates (Debian: openssl)"
    folder.mkdir(parents=True, exist_ok=True)
    _ca(folder, "ca")
    _ca(folder, "stranger-ca")
    _signed(folder, "broker", "ca", "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth")
    _signed(folder, "client", "ca", "extendedKeyUsage=clientAuth")
    _signed(folder, "stranger", "stranger-ca", "extendedKeyUsage=clientAuth")
    keystore = folder / "broker-keystore.pem"
    keystore.write_text((folder / "broker.key").read_text() + (folder / "broker.pem").read_text())
    return Pki(
        folder / "ca.pem",
        keystore,
        folder / "client.pem",
        folder / "client.key",
        folder / "stranger-ca.pem",
        folder / "stranger.pem",
        folder / "stranger.key",
    )
