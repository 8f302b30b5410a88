"""deploy/ (Kubernetes manifests, systemd units, Prometheus rules) against the code it runs, without a cluster:
every command a container or unit runs parses with the CLI, every setting it names exists, the ConfigMap loads as
settings, the metrics ports and the PodMonitor agree, the PrometheusRule holds the rule file's groups, and the
README's "Running on Kubernetes" and "Running with systemd" sections name the files there are. kubeconform and
systemd-analyze check the same files in tests/integration (test_kubernetes.py, test_packaging.py)."""

from __future__ import annotations

import configparser
import json
import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from hermeneut.cli import cli
from pipeline.config import METRICS_STAGES, ContextSettings, MetricsSettings, env_names, load_settings
from tests import TESTDATA
from tests.kubeconform import KUBERNETES, kind_file, strict

ROOT = Path(__file__).resolve().parents[2]
KUBE = ROOT / "deploy" / "kubernetes"
SYSTEMD = ROOT / "deploy" / "systemd"
RULES = ROOT / "deploy" / "prometheus" / "hermeneut.rules.yml"
README = ROOT / "README.md"
SETTINGS = env_names() | {"HERMENEUT_CONFIG"}


def manifests() -> list[dict[str, Any]]:
    return [doc for p in sorted(KUBE.glob("*.yaml")) if p.name != "kustomization.yaml" for doc in _docs(p)]


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def pod_templates() -> Iterator[tuple[str, dict[str, Any]]]:
    """(name, pod template) of the manifests that run pods: the Deployments, the DaemonSet, the Job, and the
    CronJob (its template is in its job template)."""
    for doc in manifests():
        spec = doc.get("spec", {})
        template = spec.get("template") or spec.get("jobTemplate", {}).get("spec", {}).get("template")
        if template:
            yield doc["metadata"]["name"], template


def containers() -> Iterator[tuple[str, dict[str, Any]]]:
    for name, template in pod_templates():
        spec = template["spec"]
        for c in [*spec.get("initContainers", []), *spec["containers"]]:
            yield f"{name}/{c['name']}", c


def section(title: str) -> str:
    """The README's section under ``title`` (any heading level), up to the next heading of that level or higher
    (a ``#`` line inside a fenced code block is a shell comment, not a heading)."""
    lines = README.read_text().splitlines()
    heading = re.compile(r"^(#+) (.*)$")
    starts = [i for i, line in enumerate(lines) if (m := heading.match(line)) and m.group(2) == title]
    assert starts, f"README has no section {title!r}"
    level, out, fenced = len(heading.match(lines[starts[0]]).group(1)), [], False  # type: ignore[union-attr]
    for line in lines[starts[0] + 1 :]:
        fenced ^= line.startswith("```")
        m = heading.match(line)
        if m and not fenced and not line.startswith("```") and len(m.group(1)) <= level:
            break
        out.append(line)
    return "\n".join(out)


# --- Kubernetes


def test_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((KUBE / "kustomization.yaml").read_text())
    files = sorted(p.name for p in KUBE.glob("*.yaml") if p.name != "kustomization.yaml")
    assert sorted(kustomization["resources"]) == files
    assert kustomization["namespace"] == "hermeneut"
    assert {doc["metadata"].get("namespace", "hermeneut") for doc in manifests()} == {"hermeneut"}


def test_the_configmap_loads_as_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in SETTINGS:
        monkeypatch.delenv(name, raising=False)
    (config,) = (d for d in manifests() if d["kind"] == "ConfigMap")
    toml = tmp_path / "hermeneut.toml"
    toml.write_text(config["data"]["hermeneut.toml"])
    settings = load_settings(toml)
    assert settings.metrics.host == "0.0.0.0" and settings.web.host == "0.0.0.0"
    assert settings.kafka.bootstrap_servers and settings.influxdb.url
    (process,) = (d for d in manifests() if d["metadata"]["name"] == "hermeneut-process")
    assert process["spec"]["replicas"] == settings.topics.partitions  # one processor per raw partition
    (alerts,) = (d for d in manifests() if d["metadata"]["name"] == "hermeneut-alerts")
    assert alerts["spec"]["replicas"] == 1 and alerts["spec"]["strategy"]["type"] == "Recreate"


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e for e in container.get("env", [])}


def test_every_container_runs_a_cli_command_that_parses() -> None:
    for where, c in containers():
        env = _env(c)
        used = {v for a in c["args"] for v in re.findall(r"\$\((\w+)\)", a)}
        assert used <= env.keys(), f"{where}: {c['args']} uses a variable it does not define"
        args = [re.sub(r"\$\(\w+\)", "x", a) for a in c["args"]]
        result = CliRunner().invoke(cli, [*args, "--help"])
        assert result.exit_code == 0, f"{where}: hermeneut {shlex.join(c['args'])}: {result.output}"
        assert env["HERMENEUT_CONFIG"]["value"] == "/etc/hermeneut/hermeneut.toml", where
        mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
        assert mounts["/etc/hermeneut"]["readOnly"] is True, where
        assert c["securityContext"]["readOnlyRootFilesystem"] is True, where
        assert c["securityContext"]["allowPrivilegeEscalation"] is False, where
        assert c["securityContext"]["capabilities"]["drop"] == ["ALL"], where
        assert "memory" in c["resources"]["limits"], f"{where} has no memory limit"


def test_every_hermeneut_variable_is_a_setting() -> None:
    named = {e["name"] for _, c in containers() for e in c.get("env", [])}
    (secret,) = (d for d in manifests() if d["kind"] == "Secret")
    named |= set(secret["stringData"])
    assert {n for n in named if n.startswith("HERMENEUT_")} <= SETTINGS
    assert set(secret["stringData"].values()) == {""}, "a token was committed"


def test_metrics_ports_are_the_stages_defaults_and_the_podmonitor_scrapes_them() -> None:
    defaults = MetricsSettings()
    ports = {p["name"]: p["containerPort"] for _, c in containers() for p in c.get("ports", [])}
    metrics = {name.removeprefix("metrics-"): port for name, port in ports.items() if name.startswith("metrics-")}
    assert metrics == {stage: defaults.port(stage) for stage in METRICS_STAGES}
    (monitor,) = (d for d in manifests() if d["kind"] == "PodMonitor")
    assert {e["port"] for e in monitor["spec"]["podMetricsEndpoints"]} == {f"metrics-{s}" for s in METRICS_STAGES}
    selector = monitor["spec"]["selector"]["matchLabels"]
    for name, template in pod_templates():
        assert selector.items() <= template["metadata"]["labels"].items(), name


def test_the_node_daemonset_follows_the_device_plugin_conventions() -> None:
    (node,) = (d for d in manifests() if d["kind"] == "DaemonSet")
    spec = node["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert spec["runtimeClassName"] == "nvidia"
    by_name = {c["name"]: c for c in spec["containers"]}
    assert by_name["collect"]["args"] == ["collect"]
    assert by_name["context"]["args"][:3] == ["context", "watch", "--kubernetes"]
    for c in by_name.values():
        assert _env(c)["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
        assert "nvidia.com/gpu" not in c["resources"].get("limits", {}), "the agent must not take a GPU from jobs"
    socket_dir = str(ContextSettings().kubelet_socket.parent)
    mounts = {m["mountPath"]: m for m in by_name["context"]["volumeMounts"]}
    assert mounts[socket_dir]["readOnly"] is True
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes[mounts[socket_dir]["name"]]["hostPath"]["path"] == socket_dir
    node_env = _env(by_name["collect"])["HERMENEUT_COLLECTOR__NODE"]
    assert node_env["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"


def test_the_prometheusrule_holds_the_rule_file() -> None:
    (rule,) = (d for d in manifests() if d["kind"] == "PrometheusRule")
    assert rule["spec"]["groups"] == yaml.safe_load(RULES.read_text())["groups"]


# --- the schemas kubeconform validates against (tests/kubeconform.py)


def test_the_vendored_definitions_are_closed_and_name_the_kinds_used() -> None:
    definitions = json.loads(KUBERNETES.read_text())["definitions"]
    refs = re.findall(r'"\$ref": "#/definitions/([^"]+)"', KUBERNETES.read_text())
    assert refs and set(refs) <= set(definitions)
    kinds = {
        kind_file(g["group"], g["version"], g["kind"])
        for d in definitions.values()
        for g in d.get("x-kubernetes-group-version-kind", [])
    }
    used = {kind_file(*_group_version(d["apiVersion"]), d["kind"]) for d in manifests()}
    assert used <= kinds | {"podmonitor-monitoring-v1.json", "prometheusrule-monitoring-v1.json"}
    assert (TESTDATA / "kubernetes-schemas" / "README.md").is_file()


def _group_version(api_version: str) -> tuple[str, str]:
    group, _, version = api_version.rpartition("/")
    return group, version


def test_kubeconform_file_names() -> None:
    assert kind_file("", "v1", "ConfigMap") == "configmap-v1.json"
    assert kind_file("apps", "v1", "DaemonSet") == "daemonset-apps-v1.json"
    assert kind_file("rbac.authorization.k8s.io", "v1", "ClusterRole") == "clusterrole-rbac-v1.json"
    assert kind_file("monitoring.coreos.com", "v1", "PodMonitor") == "podmonitor-monitoring-v1.json"


def test_strict_closes_objects_and_lets_int_or_string_be_either() -> None:
    schema = {
        "type": "object",
        "properties": {
            "port": {"type": "string", "format": "int-or-string", "description": "d"},
            "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            "spec": {"x-kubernetes-int-or-string": True},
            "items": {"type": "array", "items": {"type": "object", "properties": {"a": {"type": "integer"}}}},
        },
    }
    assert strict(schema) == {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "port": {"description": "d", "oneOf": [{"type": "string"}, {"type": "integer"}]},
            "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            "spec": {"oneOf": [{"type": "string"}, {"type": "integer"}]},
            "items": {
                "type": "array",
                "items": {"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": False},
            },
        },
    }


# --- systemd


def _unit(path: Path) -> configparser.RawConfigParser:
    parser = configparser.RawConfigParser(strict=False)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # systemd keys are case-sensitive
    parser.read_string(path.read_text())
    return parser


def test_every_unit_runs_a_cli_command_that_parses_with_its_settings() -> None:
    units = sorted(SYSTEMD.glob("*.service"))
    assert [u.name for u in units] == ["hermeneut-collect.service", "hermeneut-context.service"]
    for path in units:
        service = _unit(path)["Service"]
        binary, *args = shlex.split(service["ExecStart"])
        assert binary == "/opt/hermeneut/bin/hermeneut", path.name
        result = CliRunner().invoke(cli, [*args, "--help"])
        assert result.exit_code == 0, f"{path.name}: {service['ExecStart']}: {result.output}"
        assert service["EnvironmentFile"] == "/etc/hermeneut/hermeneut.env"
        assert service["KillSignal"] == "SIGTERM" and int(service["TimeoutStopSec"]) > 30  # the 30 s flush grace
    env = (SYSTEMD / "hermeneut.env").read_text()
    named = set(re.findall(r"^#? ?(HERMENEUT_\w+)=", env, re.MULTILINE))
    assert named and named <= SETTINGS


def test_the_slurm_folder_is_where_prolog_watch_and_tmpfiles_agree() -> None:
    folder = str(ContextSettings().slurm_dir)
    tmpfiles = (SYSTEMD / "hermeneut-tmpfiles.conf").read_text()
    assert re.search(rf"^d {re.escape(folder)} 0755 root root", tmpfiles, re.MULTILINE)
    prolog = (ROOT / "producers" / "context" / "hermeneut-slurm-prolog.sh").read_text()
    assert f'dir="${{HERMENEUT_SLURM_DIR:-{folder}}}"' in prolog
    assert "--slurm-dir" in _unit(SYSTEMD / "hermeneut-context.service")["Service"]["ExecStart"]


# --- what make installs


def test_debian_packages_come_without_their_recommends() -> None:
    makefile = (ROOT / "Makefile").read_text()
    installs = re.findall(r"apt-get install[^\n;|&]*", makefile)
    assert installs and all("--no-install-recommends" in line for line in installs), installs
    tools = makefile[makefile.index("\ntools:") :].split("\n\n", 1)[0]
    for package in ("chromium", "prometheus", "systemd"):
        assert re.search(rf"\$\(APT_INSTALL\) {package}\b", tools), package


# --- README


@pytest.mark.parametrize(("title", "folder"), [("Running on Kubernetes", KUBE), ("Running with systemd", SYSTEMD)])
def test_the_readme_section_matches_the_files(title: str, folder: Path) -> None:
    text = section(title)
    for path in sorted(folder.iterdir()):
        assert f"{path.relative_to(ROOT)}" in text or path.name in text, f"{title} does not mention {path.name}"
    for named in re.findall(r"\b(deploy/[\w./-]+\w)", text):
        assert (ROOT / named).exists(), f"{title} names {named}, which does not exist"
