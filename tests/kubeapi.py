"""A real Kubernetes API server for the tests: kube-apiserver on etcd, both on loopback, as controller-runtime's
envtest runs them (no kubelet, no scheduler, no controllers: the API and its storage, validation, admission and
RBAC).

Both are built once per version from the Go module proxy and cached under ``<cache>/kube-apiserver/<version>/``
and ``<cache>/etcd/<version>/``, as influxd is. ``k8s.io/kubernetes`` is not made to be a dependency: its go.mod
points its 33 staging modules (k8s.io/api, k8s.io/apiserver, ...) at ``./staging``, which a module download does
not hold. The build's own go.mod requires it and points each staging module at the release published from the
same tree (v1.37.2 -> v0.37.2), taking the list from k8s.io/kubernetes' own go.mod. etcd's server module is the
etcd binary's main package. Measured here (2 shared cores, modules already downloaded): kube-apiserver's
2,080 packages compiled in 6 min 3 s, etcd's 582 in 54 s; a cached binary costs nothing.

:func:`start` runs etcd (``--unsafe-no-fsync``: a test's data) and kube-apiserver with RBAC on, a static token of
the ``system:masters`` group for the test itself, a service-account signing key (so TokenRequest gives real
service-account tokens: what the controller runs as in a cluster), and self-signed serving certificates.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import urllib3

from pipeline.errors import ServiceError
from pipeline.services.procs import (
    free_port,
    go_output,
    pid_alive,
    port_open,
    run_logged,
    start_daemon,
    stop_pid,
    wait_until,
)

KUBERNETES = "v1.37.2"
#: the staging modules' release of the same tree
STAGING = "v0.37.2"
ETCD = "v3.6.16"
_GO = "1.26.0"


def _build(home: Path, go_mod: str, package: str, name: str, what: str) -> Path:
    """``package`` built as ``home/name`` from a module made of ``go_mod`` (cached: the binary is kept)."""
    binary = home / name
    if binary.exists():
        return binary
    if shutil.which("go") is None:
        raise ServiceError(f"building {what} needs Go on PATH")
    src = home / "src"
    shutil.rmtree(src, ignore_errors=True)
    src.mkdir(parents=True)
    (src / "go.mod").write_text(go_mod)
    # a build-tagged file names the package, so `go mod tidy` resolves its whole graph
    (src / "tools.go").write_text(f'//go:build tools\n\npackage build\n\nimport _ "{package}"\n')
    print(
        f"Building {what} once from the Go module proxy (cold: several minutes on 2 cores); log: {home / 'build.log'}"
    )
    run_logged(["go", "mod", "tidy"], home / "build.log", f"resolving {what}", cwd=src)
    packages = len(go_output(["list", "-deps", package], cwd=src).split())

    def go_progress(line: str) -> int:
        return int(bool(line) and " " not in line and not line.startswith(("#", "go:")))

    run_logged(
        ["go", "build", "-v", "-trimpath", "-ldflags=-s -w", "-o", str(binary), package],
        home / "build.log",
        f"building {what} (Go packages)",
        cwd=src,
        env=os.environ | {"CGO_ENABLED": "0"},
        total=packages,
        progress=go_progress,
    )
    shutil.rmtree(src, ignore_errors=True)
    if not binary.exists():
        raise ServiceError(f"the {what} build left no binary; see {home / 'build.log'}")
    return binary


def install_kube_apiserver(cache_dir: Path, version: str = KUBERNETES, staging: str = STAGING) -> Path:
    home = cache_dir / "kube-apiserver" / version
    if (home / "kube-apiserver").exists():
        return home / "kube-apiserver"
    home.mkdir(parents=True, exist_ok=True)
    info = json.loads(go_output(["mod", "download", "-json", f"k8s.io/kubernetes@{version}"], cwd=home))
    own = Path(info["GoMod"]).read_text()
    modules = sorted(set(re.findall(r"^\s*(k8s\.io/[\w.-]+) => \./staging/", own, re.M)))
    if not modules:
        raise ServiceError(f"k8s.io/kubernetes@{version}'s go.mod lists no staging modules: cannot build it")
    replaces = "\n".join(f"\t{m} => {m} {staging}" for m in modules)
    go_mod = f"module build\n\ngo {_GO}\n\nrequire k8s.io/kubernetes {version}\n\nreplace (\n{replaces}\n)\n"
    return _build(home, go_mod, "k8s.io/kubernetes/cmd/kube-apiserver", "kube-apiserver", f"kube-apiserver {version}")


def install_etcd(cache_dir: Path, version: str = ETCD) -> Path:
    go_mod = f"module build\n\ngo {_GO}\n\nrequire go.etcd.io/etcd/server/v3 {version}\n"
    return _build(cache_dir / "etcd" / version, go_mod, "go.etcd.io/etcd/server/v3", "etcd", f"etcd {version}")


@dataclass
class ApiServer:
    """A running API server: its URL, the CA that signed its certificate, an admin token and a kubeconfig with it."""

    url: str
    ca: Path
    token: str
    kubeconfig: Path
    run_dir: Path
    pids: tuple[int, ...]

    def kubeconfig_for(self, token: str, path: Path) -> Path:
        """A kubeconfig for the same server with another bearer token (a service account's)."""
        path.write_text(_kubeconfig(self.url, self.ca, token))
        return path

    def stop(self) -> None:
        for pid in self.pids:
            stop_pid(pid)


def _kubeconfig(url: str, ca: Path, token: str) -> str:
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "test", "cluster": {"server": url, "certificate-authority": str(ca)}}],
            "users": [{"name": "test", "user": {"token": token}}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}],
            "current-context": "test",
        }
    )


def start(cache_dir: Path, run_dir: Path, timeout_s: float = 120.0) -> ApiServer:
    """etcd and kube-apiserver (built first if need be), ready to serve."""
    etcd, apiserver = install_etcd(cache_dir), install_kube_apiserver(cache_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    client, peer, secure = free_port(), free_port(), free_port()
    etcd_pid = start_daemon(
        [
            str(etcd),
            "--name=test",
            f"--data-dir={run_dir / 'etcd'}",
            f"--listen-client-urls=http://127.0.0.1:{client}",
            f"--advertise-client-urls=http://127.0.0.1:{client}",
            f"--listen-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-cluster=test=http://127.0.0.1:{peer}",
            "--unsafe-no-fsync",
            "--log-level=warn",
        ],
        run_dir / "etcd.log",
    )
    try:
        wait_until(lambda: port_open(client), timeout_s, "etcd", lambda: pid_alive(etcd_pid))
    except ServiceError as exc:
        stop_pid(etcd_pid)
        raise ServiceError(f"{exc}; see {run_dir / 'etcd.log'}") from exc
    key = run_dir / "sa.key"
    subprocess.run(["openssl", "genrsa", "-out", str(key), "2048"], check=True, capture_output=True)
    token = secrets.token_hex(16)
    (run_dir / "tokens.csv").write_text(f'{token},admin,admin,"system:masters"\n')
    api_pid = start_daemon(
        [
            str(apiserver),
            f"--etcd-servers=http://127.0.0.1:{client}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            # no kubernetes Service endpoint to keep (it refuses a loopback address): envtest's setting
            "--endpoint-reconciler-type=none",
            f"--secure-port={secure}",
            f"--cert-dir={run_dir / 'certs'}",
            f"--token-auth-file={run_dir / 'tokens.csv'}",
            "--authorization-mode=RBAC",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={key}",
            f"--service-account-signing-key-file={key}",
            "--service-cluster-ip-range=10.0.0.0/24",
            "--disable-admission-plugins=ServiceAccount",
            "--v=0",
        ],
        run_dir / "kube-apiserver.log",
    )
    server = ApiServer(f"https://127.0.0.1:{secure}", run_dir / "certs" / "apiserver.crt", token,
                       run_dir / "kubeconfig", run_dir, (api_pid, etcd_pid))  # fmt: skip
    http = urllib3.PoolManager(cert_reqs="CERT_NONE", timeout=urllib3.Timeout(total=2), retries=False)
    urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)

    def ready() -> bool:
        try:
            r = http.request("GET", f"{server.url}/readyz", headers={"Authorization": f"Bearer {token}"})
        except urllib3.exceptions.HTTPError:
            return False
        return r.status == 200

    try:
        wait_until(ready, timeout_s, f"kube-apiserver {KUBERNETES}", lambda: pid_alive(api_pid))
    except ServiceError as exc:
        server.stop()
        raise ServiceError(f"{exc}; see {run_dir / 'kube-apiserver.log'}") from exc
    server.kubeconfig.write_text(_kubeconfig(server.url, server.ca, token))
    return server
