"""kubeconform for the tests, offline after its first build.

The binary is built once per version from the Go module proxy (``go install``) into
``<cache>/kubeconform/<version>/``, as influxd is. Its schemas are the vendored OpenAPI definitions of
``testdata/kubernetes-schemas`` (see its README), written at test time in kubeconform's layout
(``<kind><-group><-version>.json``) by :func:`write_schemas`, made strict the way kubeconform's own ``-strict``
schemas are (kubeconform's openapi2jsonschema): an object that lists its properties allows no other
(``additionalProperties: false``), and an int-or-string takes either. A ``Quantity`` (``cpu: 1``, ``memory: 1Gi``)
takes a string or a number, as the API server does.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pipeline.errors import ServiceError
from pipeline.services.procs import run_logged
from tests import TESTDATA

VERSION = "v0.8.0"
MODULE = "github.com/yannh/kubeconform/cmd/kubeconform"
SCHEMAS = TESTDATA / "kubernetes-schemas"
KUBERNETES = SCHEMAS / "kubernetes-v1.31.4-definitions.json"
#: CRD schemas (openAPIV3Schema), already named as kubeconform looks them up
CRDS = ("podmonitor-monitoring-v1.json", "prometheusrule-monitoring-v1.json")
_INT_OR_STRING = {"oneOf": [{"type": "string"}, {"type": "integer"}]}
_QUANTITY = "io.k8s.apimachinery.pkg.api.resource.Quantity"


def install(cache_dir: Path, version: str = VERSION) -> Path:
    """kubeconform ``version``, built unless the cache has it; its path."""
    home = cache_dir / "kubeconform" / version
    binary = home / "kubeconform"
    if binary.exists():
        return binary
    if shutil.which("go") is None:
        raise ServiceError("building kubeconform needs Go on PATH")
    run_logged(["go", "install", f"{MODULE}@{version}"], home / "build.log", f"building kubeconform {version}",
               env=os.environ | {"GOBIN": str(home), "CGO_ENABLED": "0"})  # fmt: skip
    if not binary.exists():
        raise ServiceError(f"go install left no kubeconform in {home}; see {home / 'build.log'}")
    return binary


def strict(schema: Any) -> Any:
    """``schema`` with every object that lists properties closed to others, and int-or-string made a choice."""
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    if schema.get("format") == "int-or-string" or schema.get("x-kubernetes-int-or-string"):
        return {k: v for k, v in schema.items() if k in ("description",)} | _INT_OR_STRING
    out = {k: strict(v) for k, v in schema.items()}
    if "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def kind_file(group: str, version: str, kind: str) -> str:
    """The file name kubeconform asks for (its ``{{ .ResourceKind }}{{ .KindSuffix }}.json``)."""
    first = group.split(".", maxsplit=1)[0]
    suffix = f"-{first.lower()}-{version.lower()}" if group else f"-{version.lower()}"
    return f"{kind.lower()}{suffix}.json"


def write_schemas(out: Path) -> list[str]:
    """Every vendored kind's schema in kubeconform's layout under ``out``; the file names written."""
    out.mkdir(parents=True, exist_ok=True)
    definitions = json.loads(KUBERNETES.read_text())["definitions"]
    definitions = strict(definitions) | {_QUANTITY: {"oneOf": [{"type": "string"}, {"type": "number"}]}}
    written = []
    for name, definition in sorted(definitions.items()):
        for gvk in definition.get("x-kubernetes-group-version-kind", []):
            # self-contained: the definitions it refers to travel with it, under the same JSON pointers
            doc = {"$ref": f"#/definitions/{name}", "definitions": definitions}
            file = kind_file(gvk["group"], gvk["version"], gvk["kind"])
            (out / file).write_text(json.dumps(doc))
            written.append(file)
    for file in CRDS:
        (out / file).write_text(json.dumps(strict(json.loads((SCHEMAS / file).read_text()))))
        written.append(file)
    return written


def validate(binary: Path, schemas: Path, manifests: Sequence[Path]) -> tuple[int, list[dict[str, Any]]]:
    """kubeconform ``-strict`` on ``manifests`` with only the schemas in ``schemas`` (no download, none skipped): its
    exit code and one result per resource (``status``: ``statusValid``, ``statusInvalid``, ``statusError``...)."""
    done = subprocess.run(
        [str(binary), "-strict", "-summary", "-verbose", "-output", "json",
         "-schema-location", f"{schemas}/{{{{ .ResourceKind }}}}{{{{ .KindSuffix }}}}.json", *map(str, manifests)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    report = json.loads(done.stdout)
    resources: list[dict[str, Any]] = report.get("resources", [])
    return done.returncode, resources
