"""A thin client of the Kubernetes API: what ``hermeneut kubernetes sync`` reads and writes, over HTTPS with the
credentials a kubeconfig or a pod's service account gives, and nothing more (no client library: five calls).

Credentials, as kubectl finds them: a kubeconfig named in the settings; else the pod's service account (in a
cluster: ``KUBERNETES_SERVICE_HOST`` and the mounted token and CA); else ``$KUBECONFIG``'s first file; else
``~/.kube/config``. From a kubeconfig: the context's server, its CA (file or data, or
``insecure-skip-tls-verify``), and a bearer token (or token file) or a client certificate and key (file or data).
An ``exec`` or ``auth-provider`` user is refused in one line: name a token or a certificate instead.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import urllib3
import yaml

from pipeline.errors import ConfigError, HermeneutError

#: where a pod finds its service account (the kubelet mounts it)
SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
NODES = "/api/v1/nodes"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
RULES = "/apis/resource.k8s.io/v1/devicetaintrules"


class ApiError(HermeneutError):
    """The API server refused or failed a call; ``status`` is its HTTP status (0: no answer)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}" if status else message)
        self.status = status


@dataclass(frozen=True)
class Credentials:
    server: str
    #: a CA bundle (PEM text); None: the system's, or none at all when ``verify`` is False
    ca_pem: str | None = None
    verify: bool = True
    token: str | None = field(default=None, repr=False)
    cert_pem: str | None = field(default=None, repr=False)
    key_pem: str | None = field(default=None, repr=False)


def credentials(kubeconfig: Path | None = None, context: str | None = None) -> Credentials:
    """Where the API server is and who we are to it (module doc for the order); :class:`ConfigError` in one
    line when none can be found or read."""
    if kubeconfig is None:
        host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        if host and (SERVICE_ACCOUNT / "token").is_file():
            return Credentials(
                server=f"https://{host}:{port}",
                ca_pem=(SERVICE_ACCOUNT / "ca.crt").read_text(),
                token=(SERVICE_ACCOUNT / "token").read_text().strip(),
            )
        env = os.environ.get("KUBECONFIG", "").split(os.pathsep)[0]
        kubeconfig = Path(env) if env else Path.home() / ".kube" / "config"
    try:
        doc = yaml.safe_load(kubeconfig.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read the kubeconfig {kubeconfig}: {exc}".splitlines()[0]) from exc
    return _from_kubeconfig(doc if isinstance(doc, dict) else {}, context, kubeconfig)


def _named(doc: Mapping[str, Any], section: str, name: str, where: Path) -> Mapping[str, Any]:
    for item in doc.get(section) or []:
        if isinstance(item, dict) and item.get("name") == name:
            return item.get(section[:-1]) or {}
    raise ConfigError(f"the kubeconfig {where} has no {section[:-1]} named {name!r}")


def _from_kubeconfig(doc: Mapping[str, Any], context: str | None, where: Path) -> Credentials:
    name = context or doc.get("current-context")
    if not name:
        raise ConfigError(f"the kubeconfig {where} names no current-context: set kubernetes.context")
    ctx = _named(doc, "contexts", str(name), where)
    cluster = _named(doc, "clusters", str(ctx.get("cluster", "")), where)
    user = _named(doc, "users", str(ctx.get("user", "")), where) if ctx.get("user") else {}
    if "exec" in user or "auth-provider" in user:
        raise ConfigError(
            f"the kubeconfig {where}: user {ctx.get('user')!r} needs a plugin: give a token or a certificate"
        )
    base = where.parent

    def pem(data_key: str, file_key: str, source: Mapping[str, Any]) -> str | None:
        if source.get(data_key):
            return base64.b64decode(source[data_key]).decode()
        if source.get(file_key):
            return (base / str(source[file_key])).read_text()
        return None

    server = str(cluster.get("server", ""))
    if not server.startswith(("https://", "http://")):
        raise ConfigError(f"the kubeconfig {where}: cluster server {server!r} is not an http(s) URL")
    token = user.get("token") or (
        (base / str(user["tokenFile"])).read_text().strip() if user.get("tokenFile") else None
    )
    try:
        return Credentials(
            server=server.rstrip("/"),
            ca_pem=pem("certificate-authority-data", "certificate-authority", cluster),
            verify=not cluster.get("insecure-skip-tls-verify", False),
            token=str(token) if token else None,
            cert_pem=pem("client-certificate-data", "client-certificate", user),
            key_pem=pem("client-key-data", "client-key", user),
        )
    except (OSError, ValueError) as exc:
        raise ConfigError(f"the kubeconfig {where}: {exc}".splitlines()[0]) from exc


class Client:
    """The calls the controller makes. Each raises :class:`ApiError` for an answer that is not a success."""

    def __init__(self, creds: Credentials, timeout_s: float = 10.0) -> None:
        self.server = creds.server
        self._headers = {"Accept": "application/json"}
        if creds.token:
            self._headers["Authorization"] = f"Bearer {creds.token}"
        ctx = ssl.create_default_context(cadata=creds.ca_pem) if creds.ca_pem else ssl.create_default_context()
        if not creds.verify:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if creds.cert_pem and creds.key_pem:
            # the ssl module loads a client certificate from files only: written to a private temporary file
            with tempfile.NamedTemporaryFile("w", suffix=".pem") as pem:
                pem.write(creds.cert_pem + "\n" + creds.key_pem)
                pem.flush()
                ctx.load_cert_chain(pem.name)
        self._http = urllib3.PoolManager(
            ssl_context=ctx, timeout=urllib3.Timeout(total=timeout_s), retries=urllib3.Retry(total=2, status=0)
        )

    def _call(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> Any:
        headers = dict(self._headers)
        data = None
        if body is not None:
            headers["Content-Type"] = content_type
            data = json.dumps(body).encode()
        try:
            r = self._http.request(method, self.server + path, body=data, headers=headers)
        except urllib3.exceptions.HTTPError as exc:
            raise ApiError(0, f"{method} {path}: no answer from {self.server}: {exc}") from exc
        if r.status >= 300:
            try:
                message = json.loads(r.data).get("message", "")
            except (ValueError, AttributeError):
                message = r.data[:200].decode(errors="replace")
            raise ApiError(r.status, f"{method} {path}: {message}")
        return json.loads(r.data) if r.data else {}

    def list(self, path: str, label_selector: str | None = None) -> Iterator[dict[str, Any]]:
        """Every item of a collection, 500 at a time."""
        token = ""
        while True:
            query = "?limit=500" + (f"&continue={quote(token)}" if token else "")
            if label_selector:
                query += f"&labelSelector={quote(label_selector)}"
            page = self._call("GET", path + query)
            yield from page.get("items") or []
            token = (page.get("metadata") or {}).get("continue") or ""
            if not token:
                return

    def create(self, path: str, obj: Mapping[str, Any]) -> dict[str, Any]:
        return dict(self._call("POST", path, obj))

    def merge(self, path: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        """A JSON merge patch (RFC 7386)."""
        return dict(self._call("PATCH", path, patch, "application/merge-patch+json"))

    def strategic(self, path: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        """A strategic merge patch (lists merged by their key: a node's conditions by ``type``)."""
        return dict(self._call("PATCH", path, patch, "application/strategic-merge-patch+json"))

    def delete(self, path: str) -> None:
        try:
            self._call("DELETE", path)
        except ApiError as exc:
            if exc.status != 404:  # gone already: what was asked
                raise

    def close(self) -> None:
        self._http.clear()
