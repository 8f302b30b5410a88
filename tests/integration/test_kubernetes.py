"""The manifests of deploy/kubernetes are valid Kubernetes 1.31 objects: kubeconform (built from the Go module
proxy, cached like influxd) checks each one with ``-strict`` against the official OpenAPI definitions and the
Prometheus Operator's CRD schemas vendored in tests/testdata/kubernetes-schemas, offline. A misspelt field, a wrong
type or an unknown kind fails it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pipeline.config import Settings
from tests import kubeconform

pytestmark = pytest.mark.integration

KUBE = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"


@pytest.fixture(scope="module")
def checker(defaults: Settings, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    schemas = tmp_path_factory.mktemp("schemas")
    kubeconform.write_schemas(schemas)
    return kubeconform.install(defaults.services.cache_dir), schemas


def test_every_manifest_is_valid_against_the_kubernetes_schemas(checker: tuple[Path, Path]) -> None:
    binary, schemas = checker
    files = sorted(p for p in KUBE.glob("*.yaml") if p.name != "kustomization.yaml")
    code, results = kubeconform.validate(binary, schemas, files)
    assert {(r["kind"], r["name"], r["status"]) for r in results if r["status"] != "statusValid"} == set(), results
    expected = {(d["kind"], d["metadata"]["name"]) for p in files for d in yaml.safe_load_all(p.read_text()) if d}
    assert {(r["kind"], r["name"]) for r in results} == expected  # each one checked, none skipped
    assert code == 0


@pytest.mark.parametrize(
    ("file", "old", "new", "status"),
    [
        ("process.yaml", "resources:", "resorces:", "statusInvalid"),  # a field Kubernetes does not know
        ("process.yaml", "replicas: 6", "replicas: six", "statusInvalid"),
        ("process.yaml", "containerPort: 9473", 'containerPort: "9473"', "statusInvalid"),
        ("podmonitor.yaml", "interval: 15s", "intervall: 15s", "statusInvalid"),  # a CRD's schema is strict too
        ("namespace.yaml", "kind: Namespace", "kind: Namespaces", "statusError"),  # no schema for it
    ],
)
def test_a_broken_manifest_fails(
    checker: tuple[Path, Path], tmp_path: Path, file: str, old: str, new: str, status: str
) -> None:
    binary, schemas = checker
    text = (KUBE / file).read_text()
    assert old in text
    broken = tmp_path / file
    broken.write_text(text.replace(old, new, 1))
    code, results = kubeconform.validate(binary, schemas, [broken])
    assert code != 0 and [r["status"] for r in results] == [status], results
