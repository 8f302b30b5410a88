"""Kubernetes pods per GPU: the kubelet says which container holds which GPU, the API server says what it is.

1. The kubelet's PodResources API (:mod:`producers.context.podresources`) maps each GPU (or MIG) uuid the NVIDIA
   device plugin handed out (``nvidia.com/gpu``, ``nvidia.com/mig-*``) to a pod and container, as dcgm-exporter
   does. This alone gives job (``<namespace>/<pod>``) and tenant (namespace).
2. The API server (``GET /api/v1/pods?fieldSelector=spec.nodeName=<node>``, in-cluster service-account token,
   once a minute and at once when a GPU pod appears that it has not described) adds what the pod says about
   itself. Honoured, in order:

   | what        | from                                                                                       |
   |-------------|--------------------------------------------------------------------------------------------|
   | application | annotation ``hermeneut.dev/application`` (confidence 0.95), else guessed (capped at 0.6)    |
   |             | from the GPU container's image, command and args, and the ``app`` /                        |
   |             | ``app.kubernetes.io/name`` labels                                                          |
   | model       | annotation ``hermeneut.dev/model``, else the container args (``--model ...``) or ``MODEL_ID`` |
   | framework   | annotation ``hermeneut.dev/framework``, else guessed from the same evidence                 |
   | job         | annotation ``hermeneut.dev/job``, else label ``batch.kubernetes.io/job-name`` / ``job-name`` /  |
   |             | ``training.kubeflow.org/job-name`` / ``jobset.sigs.k8s.io/jobset-name`` /                   |
   |             | ``app.kubernetes.io/instance``, else the owner (ReplicaSet, StatefulSet...), else the pod    |
   | user        | annotation ``hermeneut.dev/user``                                                          |
   | tenant      | the namespace                                                                              |
   | job_gpus    | annotation ``hermeneut.dev/job-gpus``, else the ``nvidia.com/gpu`` limits summed over every   |
   |             | pod of the job's label in the namespace (asked once per job), else the pod's own GPUs       |

When the API server cannot be reached the GPU -> pod mapping still follows the kubelet and the pods' last
known metadata is kept (logged once, retried with backoff).
"""

from __future__ import annotations

import json
import logging
import os
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol

from pipeline.config import ContextSettings
from pipeline.errors import ConfigError, SourceUnavailable
from pipeline.events import Workload
from pipeline.registry import from_section, section_config
from producers.context.base import (
    DECLARED_CONFIDENCE,
    HINT_CONFIDENCE_CAP,
    Backoff,
    Observation,
    is_application,
)
from producers.context.inference import EVIDENCE_ENV, Evidence, capped, infer
from producers.context.inventory import GpuInventory
from producers.context.podresources import PodResources, PodResourcesClient

if TYPE_CHECKING:
    from pipeline.config import Settings

log = logging.getLogger(__name__)

GPU_RESOURCE: Final = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX: Final = "nvidia.com/mig-"
ANNOTATION: Final = "hermeneut.dev/"
JOB_LABELS: Final = (
    "batch.kubernetes.io/job-name",
    "job-name",
    "training.kubeflow.org/job-name",
    "jobset.sigs.k8s.io/jobset-name",
    "app.kubernetes.io/instance",
)
APP_LABELS: Final = ("app", "app.kubernetes.io/name")
SERVICE_ACCOUNT: Final = Path("/var/run/secrets/kubernetes.io/serviceaccount")
_JOB_GPUS_TTL_S: Final = 300.0
#: how old the pods' metadata may get before the API server is asked again (sooner when a new pod appears)
META_TTL_S: Final = 60.0


@dataclass(frozen=True, slots=True)
class ContainerSpec:
    name: str
    image: str | None
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    gpu_limit: int


@dataclass(frozen=True, slots=True)
class PodMeta:
    namespace: str
    name: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    containers: tuple[ContainerSpec, ...]
    owner: str | None = None
    phase: str | None = None

    @property
    def gpu_limit(self) -> int:
        return sum(c.gpu_limit for c in self.containers)


def _str_map(value: Any) -> dict[str, str]:
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else {}


def _gpu_count(resources: Any) -> int:
    limits = resources.get("limits") if isinstance(resources, dict) else None
    if not isinstance(limits, dict):
        return 0
    total = 0
    for name, value in limits.items():
        if name == GPU_RESOURCE or str(name).startswith(MIG_RESOURCE_PREFIX):
            total += int(value) if str(value).isdigit() else 0
    return total


def parse_pod(obj: Any) -> PodMeta:
    """A pod object of the API server; raises ValueError when it lacks what identifies a pod."""
    if not isinstance(obj, dict):
        raise ValueError("a pod must be an object")
    meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
    if not isinstance(meta, dict) or not isinstance(spec, dict) or not meta.get("name"):
        raise ValueError("a pod needs metadata.name")
    containers = []
    for c in spec.get("containers") or []:
        if not isinstance(c, dict):
            continue
        argv = tuple(str(a) for a in [*(c.get("command") or []), *(c.get("args") or [])])
        env = tuple(
            (str(e["name"]), str(e["value"]))
            for e in c.get("env") or []
            if isinstance(e, dict) and e.get("name") in EVIDENCE_ENV and isinstance(e.get("value"), str)
        )
        containers.append(
            ContainerSpec(str(c.get("name", "")), c.get("image"), argv, env, _gpu_count(c.get("resources")))
        )
    owners = [o for o in meta.get("ownerReferences") or [] if isinstance(o, dict) and o.get("name")]
    status = obj.get("status")
    phase = status.get("phase") if isinstance(status, dict) else None
    return PodMeta(
        namespace=str(meta.get("namespace") or "default"),
        name=str(meta["name"]),
        labels=_str_map(meta.get("labels")),
        annotations=_str_map(meta.get("annotations")),
        containers=tuple(containers),
        owner=str(owners[0]["name"]) if owners else None,
        phase=str(phase) if phase else None,
    )


def parse_pod_list(doc: Any) -> list[PodMeta]:
    """The ``items`` of a PodList; pods that do not parse are left out (and counted by the caller's log)."""
    items = doc.get("items") if isinstance(doc, dict) else None
    if not isinstance(items, list):
        raise SourceUnavailable("API server answer is not a PodList")
    pods = []
    for item in items:
        try:
            pods.append(parse_pod(item))
        except ValueError as exc:
            log.debug("skipping pod: %s", exc)
    return pods


def job_of(pod: PodMeta) -> tuple[str, str | None]:
    """(job name, the label that groups the job's pods or None) for a pod."""
    if pod.annotations.get(ANNOTATION + "job"):
        return pod.annotations[ANNOTATION + "job"], None
    for label in JOB_LABELS:
        if pod.labels.get(label):
            return pod.labels[label], label
    return pod.owner or pod.name, None


def pod_workload(
    pod: PodMeta, container: str, gpus_here: int, job_gpus: int | None, warn: Callable[[str], None]
) -> Workload:
    """What a pod (its GPU container) says about the workload on its GPUs."""
    notes = pod.annotations
    spec = next((c for c in pod.containers if c.name == container), None)
    name = " ".join(v for v in (*(pod.labels.get(label) for label in APP_LABELS), pod.name) if v)
    evidence = Evidence(
        argv=spec.argv if spec else (), image=spec.image if spec else None, name=name, env=spec.env if spec else ()
    )
    guessed = infer(evidence)
    guessed = capped(guessed, HINT_CONFIDENCE_CAP) if guessed is not None else None
    declared = notes.get(ANNOTATION + "application")
    application, confidence = "unknown", 0.0
    if declared and is_application(declared):
        application, confidence = declared, DECLARED_CONFIDENCE
    else:
        if declared:
            warn(
                f"pod {pod.namespace}/{pod.name}: annotation {ANNOTATION}application={declared!r} is not an application"
            )
        if guessed is not None and guessed.application != "unknown":
            application, confidence = guessed.application, guessed.confidence
    declared_gpus = notes.get(ANNOTATION + "job-gpus", "")
    job, _ = job_of(pod)
    return Workload(
        application,
        job_id=f"{pod.namespace}/{job}",
        user=notes.get(ANNOTATION + "user") or None,
        source="kubernetes",
        confidence=confidence,
        tenant=pod.namespace,
        model=notes.get(ANNOTATION + "model") or (guessed.model if guessed else None),
        framework=notes.get(ANNOTATION + "framework") or (guessed.framework if guessed else None),
        job_gpus=int(declared_gpus) if declared_gpus.isdigit() and int(declared_gpus) > 0 else job_gpus or gpus_here,
    )


class ApiServer:
    """A minimal, read-only Kubernetes API client (two GETs); the token is re-read per call (it rotates)."""

    def __init__(
        self, url: str, token_file: Path | None = None, ca_file: Path | None = None, timeout_s: float = 10.0
    ) -> None:
        self.url, self.token_file, self.timeout_s = url.rstrip("/"), token_file, timeout_s
        try:
            self._ssl = ssl.create_default_context(cafile=str(ca_file)) if ca_file and url.startswith("https") else None
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"cannot use the API server's CA file {ca_file}: {exc}") from None

    @classmethod
    def in_cluster(cls, url: str | None, token_file: Path | None, ca_file: Path | None, timeout_s: float) -> ApiServer:
        """The configured API server, else the one the pod's service account points at."""
        if url is None:
            host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
            if not host:
                raise ConfigError(
                    "--kubernetes outside a pod needs the API server's URL (HERMENEUT_CONTEXT__KUBERNETES_API)"
                )
            url = f"https://{host}:{port}" if ":" not in host else f"https://[{host}]:{port}"
            token_file = token_file or SERVICE_ACCOUNT / "token"
            ca_file = ca_file or SERVICE_ACCOUNT / "ca.crt"
        return cls(url, token_file, ca_file, timeout_s)

    def get(self, path: str, **query: str) -> Any:
        request = urllib.request.Request(f"{self.url}{path}?{urllib.parse.urlencode(query)}")
        if self.token_file is not None:
            try:
                request.add_header("Authorization", f"Bearer {self.token_file.read_text().strip()}")
            except OSError as exc:
                raise SourceUnavailable(
                    f"cannot read the service-account token {self.token_file}: {exc.strerror}"
                ) from exc
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s, context=self._ssl) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            raise SourceUnavailable(f"API server {path}: HTTP {exc.code} {exc.reason}") from exc
        except (urllib.error.URLError, TimeoutError, OSError) as exc:
            raise SourceUnavailable(f"API server {self.url} unreachable: {exc}") from exc
        except ValueError as exc:
            raise SourceUnavailable(f"API server {path}: answer is not JSON") from exc

    def node_pods(self, node: str) -> list[PodMeta]:
        return parse_pod_list(self.get("/api/v1/pods", fieldSelector=f"spec.nodeName={node}"))

    def job_gpus(self, namespace: str, label: str, value: str) -> int:
        """GPUs the job's running pods ask for, across all nodes."""
        pods = parse_pod_list(
            self.get(f"/api/v1/namespaces/{urllib.parse.quote(namespace)}/pods", labelSelector=f"{label}={value}")
        )
        return sum(p.gpu_limit for p in pods if p.phase not in ("Succeeded", "Failed"))


class PodResourcesLister(Protocol):
    def list(self) -> Sequence[PodResources]: ...


def is_gpu_resource(resource_name: str) -> bool:
    return resource_name == GPU_RESOURCE or resource_name.startswith(MIG_RESOURCE_PREFIX)


def _holds_gpu(pod: PodResources) -> bool:
    return any(is_gpu_resource(d.resource_name) for c in pod.containers for d in c.devices if d.device_ids)


@dataclass(frozen=True, slots=True)
class KubernetesConfig:
    """The ``kubernetes`` context source's settings (the ``context`` section's)."""

    kubelet_socket: Path = from_section(ContextSettings, "kubelet_socket")
    kubernetes_api: str | None = from_section(ContextSettings, "kubernetes_api")
    kubernetes_token_file: Path | None = from_section(ContextSettings, "kubernetes_token_file")
    kubernetes_ca_file: Path | None = from_section(ContextSettings, "kubernetes_ca_file")
    command_timeout_s: float = from_section(ContextSettings, "command_timeout_s")


class KubernetesSource:
    """GPU -> pod from the kubelet, pod -> workload from the API server (``api`` None: kubelet only); registered as
    ``kubernetes``."""

    name = "kubernetes"
    description = "Pods from the kubelet's pod-resources socket + API server."
    covers = "Kubernetes pods"
    Config = KubernetesConfig

    @classmethod
    def configure(cls, settings: Settings, **options: object) -> KubernetesConfig:
        return section_config(KubernetesConfig, settings.context, "the kubernetes context source", **options)

    @classmethod
    def validate(cls, config: KubernetesConfig) -> None:
        """The bounds are the settings'; the API server is found when built (in a pod: from its service account)."""

    @classmethod
    def from_config(
        cls,
        config: KubernetesConfig,
        node: str,
        inventory: GpuInventory,
        kubelet: PodResourcesLister | None = None,
        api: ApiServer | None = None,
    ) -> KubernetesSource:
        """Built, not connected: the kubelet's socket and the API server are first asked at the first poll."""
        timeout_s = config.command_timeout_s
        if api is None:
            api = ApiServer.in_cluster(
                config.kubernetes_api, config.kubernetes_token_file, config.kubernetes_ca_file, timeout_s
            )
        return cls(node, inventory, kubelet or PodResourcesClient(config.kubelet_socket, timeout_s), api)

    def __init__(
        self,
        node: str,
        inventory: GpuInventory,
        kubelet: PodResourcesLister,
        api: ApiServer | None,
        backoff: Backoff | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.node, self.inventory, self.kubelet, self.api = node, inventory, kubelet, api
        self.backoff = backoff or Backoff(clock=clock)
        self.clock = clock
        self._meta: dict[tuple[str, str], PodMeta] = {}
        self._meta_at = -META_TTL_S
        self._asked: set[tuple[str, str]] = set()
        self._job_gpus: dict[tuple[str, str, str], tuple[float, int]] = {}
        self._warned: set[str] = set()
        self._api_failing = False

    def _warn_once(self, message: str) -> None:
        if message not in self._warned:
            self._warned.add(message)
            log.warning("kubernetes: %s", message)

    def _refresh_meta(self, allocations: Sequence[PodResources]) -> None:
        if self.api is None or not self.backoff.ready():
            return
        holding = {(p.namespace, p.name) for p in allocations if _holds_gpu(p)}
        unseen = holding - self._meta.keys() - self._asked
        if not unseen and self.clock() - self._meta_at < META_TTL_S:
            return  # one GET per minute per node, not per poll: the API server serves every node of the cluster
        try:
            pods = self.api.node_pods(self.node)
        except SourceUnavailable as exc:
            if not self._api_failing:
                log.warning("kubernetes: %s; keeping the pods' last known metadata, retrying with backoff", exc)
            self._api_failing = True
            self.backoff.fail()
            return
        if self._api_failing:
            log.info("kubernetes: API server answers again")
        self._api_failing = False
        self.backoff.ok()
        self._meta = {(p.namespace, p.name): p for p in pods}
        self._meta_at = self.clock()
        self._asked = holding  # a pod the API server did not list is not asked for again until the next refresh

    def _job_gpus_of(self, pod: PodMeta) -> int | None:
        job, label = job_of(pod)
        if label is None or self.api is None:
            return None
        key = (pod.namespace, label, job)
        cached = self._job_gpus.get(key)
        if cached is not None and (self._api_failing or self.clock() - cached[0] < _JOB_GPUS_TTL_S):
            return cached[1]
        if self._api_failing:
            return None
        try:
            count = self.api.job_gpus(pod.namespace, label, job)
        except SourceUnavailable as exc:
            self._warn_once(f"cannot count the GPUs of job {pod.namespace}/{job}: {exc}")
            return cached[1] if cached else None
        self._job_gpus[key] = (self.clock(), count)
        return count or None

    def poll(self) -> Observation:
        allocations = self.kubelet.list()  # SourceUnavailable: the watch loop keeps the last observation
        self._refresh_meta(allocations)
        out: dict[str, Workload] = {}
        for pod in allocations:
            for container in pod.containers:
                uuids = []
                for devices in container.devices:
                    if not is_gpu_resource(devices.resource_name):
                        continue
                    for device in devices.device_ids:
                        uuid = self.inventory.resolve(device)
                        if uuid is None:
                            self._warn_once(
                                f"device {device} of pod {pod.namespace}/{pod.name} is not a GPU of this node"
                            )
                        else:
                            uuids.append(uuid)
                if not uuids:
                    continue
                meta = self._meta.get((pod.namespace, pod.name))
                if meta is None:
                    workload = Workload(
                        "unknown",
                        job_id=f"{pod.namespace}/{pod.name}",
                        source="kubernetes",
                        tenant=pod.namespace,
                        job_gpus=len(uuids),
                    )
                else:
                    workload = pod_workload(meta, container.name, len(uuids), self._job_gpus_of(meta), self._warn_once)
                for uuid in uuids:
                    out[uuid] = workload
        live = {(p.namespace, p.name) for p in allocations}
        self._job_gpus = {k: v for k, v in self._job_gpus.items() if any(k[0] == ns for ns, _ in live)}
        return out
