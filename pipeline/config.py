"""One settings object for every hermeneut process.

Sources, highest priority first: keyword arguments, environment variables (``HERMENEUT_`` prefix, ``__``
between levels, e.g. ``HERMENEUT_KAFKA__BOOTSTRAP_SERVERS``), then a TOML file named by ``HERMENEUT_CONFIG``
(or ``--config`` on the CLI), then defaults. An invalid value raises :class:`pipeline.errors.ConfigError` whose
message is one readable line; only the CLI turns it into an exit code.

:func:`load_settings` reads the environment and never writes it: the TOML file is handed to the settings class
it builds, and a child process gets its settings as an environment of its own
(:func:`pipeline.services.child_env`, from :func:`settings_env`).

Leaving ``kafka.bootstrap_servers`` or ``influxdb.url`` unset means "use the local services that
``hermeneut services up`` (or ``hermeneut run``) started"; setting them means nothing local is started.
"""

from __future__ import annotations

import difflib
import ipaddress
import os
import re
from pathlib import Path
from typing import Any, ClassVar, Final, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from pipeline import registry
from pipeline.errors import ConfigError

ENV_PREFIX = "HERMENEUT_"
CONFIG_FILE_ENV = "HERMENEUT_CONFIG"


def _default_cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hermeneut"


def _default_state_dir() -> Path:
    return Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / "hermeneut"


_HOST_NAME = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,62}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,62}[A-Za-z0-9])?)*$"
)


def _comma_list(value: str) -> list[str]:
    return [part.strip() for part in value.split(",") if part.strip()]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @field_validator("*", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: Any, info: ValidationInfo) -> Any:
        """``VAR=`` (empty) means "not set" for optional values instead of an empty token or a path ``.``."""
        if value == "" and info.field_name is not None:
            field = cls.model_fields[info.field_name]
            if not field.is_required() and field.default is None:
                return None
        return value


class KafkaSettings(_Section):
    """Where Kafka is and how to talk to it; ``version`` is only used for the local broker."""

    bootstrap_servers: str | None = None
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    ssl_cafile: Path | None = None
    #: the client's certificate and private key (PEM), for brokers that authenticate clients by TLS (mTLS)
    ssl_certfile: Path | None = None
    ssl_keyfile: Path | None = None
    ssl_key_password: SecretStr | None = None
    version: str = "4.1.1"
    fallback_version: str = "3.9.1"
    heap_mb: int = Field(default=512, ge=256, le=16384)
    #: how long a consumer that died silently keeps its partitions before the group moves them
    session_timeout_s: float = Field(default=45.0, ge=6.0, le=1800.0)
    #: how long admin operations (topic creation, metadata) wait for the cluster
    request_timeout_s: float = Field(default=30.0, gt=0, le=600.0)

    @field_validator("bootstrap_servers")
    @classmethod
    def _hosts_ports(cls, value: str | None) -> str | None:
        if value is None:
            return None
        for server in value.split(","):
            host, sep, port = server.strip().rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"expected host:port[,host:port...], got {value!r}")
        return value

    @model_validator(mode="after")
    def _sasl_complete(self) -> KafkaSettings:
        if self.security_protocol.startswith("SASL") and not (
            self.sasl_mechanism and self.sasl_username and self.sasl_password
        ):
            raise ValueError(
                f"security_protocol {self.security_protocol} needs sasl_mechanism, sasl_username and sasl_password"
            )
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            raise ValueError("ssl_certfile and ssl_keyfile go together (the client's certificate and its key)")
        if self.ssl_certfile is not None and not self.security_protocol.endswith("SSL"):
            raise ValueError(
                f"a client certificate needs security_protocol SSL or SASL_SSL, not {self.security_protocol}"
            )
        for name in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
            path = getattr(self, name)
            if path is not None and not path.is_file():
                raise ValueError(f"{name} {path} is not a readable file")
        return self

    def client_config(self) -> dict[str, Any]:
        """librdkafka (confluent-kafka) settings for these servers; raises if no servers are known."""
        if self.bootstrap_servers is None:
            raise ConfigError("kafka.bootstrap_servers is not set and no local Kafka is running")
        conf: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap_servers,
            "security.protocol": self.security_protocol,
        }
        if self.sasl_mechanism:
            conf["sasl.mechanism"] = self.sasl_mechanism
            conf["sasl.username"] = self.sasl_username or ""
            conf["sasl.password"] = self.sasl_password.get_secret_value() if self.sasl_password else ""
        if self.ssl_cafile:
            conf["ssl.ca.location"] = str(self.ssl_cafile)
        if self.ssl_certfile and self.ssl_keyfile:
            conf["ssl.certificate.location"] = str(self.ssl_certfile)
            conf["ssl.key.location"] = str(self.ssl_keyfile)
            if self.ssl_key_password:
                conf["ssl.key.password"] = self.ssl_key_password.get_secret_value()
        return conf


class InfluxSettings(_Section):
    """Where InfluxDB 2.x is; ``version`` is only used to build the local ``influxd``."""

    url: str | None = None
    org: str = "hermeneut"
    bucket: str = "telemetry"
    token: SecretStr | None = None
    version: str = "v2.7.12"
    batch_size: int = Field(default=5000, ge=1, le=100_000)
    flush_interval_s: float = Field(default=0.2, gt=0, le=60)
    timeout_s: float = Field(default=10.0, gt=0)
    #: after SIGTERM, how long the sink keeps retrying an unreachable InfluxDB before it exits (uncommitted
    #: data stays in Kafka and is stored by the next run)
    shutdown_grace_s: float = Field(default=30.0, ge=0, le=3600)

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError(f"expected an http:// or https:// URL, got {value!r}")
        return value.rstrip("/") if value else value


class OtlpSettings(_Section):
    """Where the ``otlp`` sink (``hermeneut sink --sink otlp``) sends: an OpenTelemetry Collector's OTLP/HTTP."""

    #: the OTLP/HTTP base URL, e.g. http://collector:4318 (``/v1/metrics`` and ``/v1/logs`` go after it)
    endpoint: str | None = None
    #: request headers as ``name=value,name=value`` (an API key of a hosted endpoint); never shown or logged
    headers: SecretStr | None = None
    timeout_s: float = Field(default=10.0, gt=0)
    #: data points + log records per request at most
    max_request_items: int = Field(default=10_000, ge=1, le=1_000_000)

    @field_validator("endpoint")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError(f"expected an http:// or https:// URL, got {value!r}")
        return value.rstrip("/") if value else value


class KubernetesSettings(_Section):
    """What ``hermeneut kubernetes sync`` writes into a Kubernetes cluster from the health topic
    (sinks/kubernetes; docs/health.md): a node condition per node, a DRA DeviceTaintRule per GPU that is not
    healthy. The cluster is the one ``cluster`` names: health of other clusters is left alone."""

    #: a kubeconfig file; unset: the pod's service account (in a cluster), else $KUBECONFIG, else ~/.kube/config
    kubeconfig: Path | None = None
    #: the kubeconfig context to use; unset: its current-context
    context: str | None = None
    #: the node condition written on every node hermeneut has health for: True when all its GPUs are healthy
    #: (as the EKS node monitoring agent's AcceleratedHardwareReady: True is good), False when one is not
    condition_type: str = Field(default="HermeneutGPUHealthy", pattern=r"^[A-Za-z][A-Za-z0-9]{0,62}$")
    #: the DeviceTaint key (a label name); its value is the GPU's state (degraded, unhealthy), what a toleration
    #: names to accept it
    taint_key: str = Field(default="hermeneut.io/gpu-health", pattern=r"^([a-z0-9.-]{1,253}/)?[A-Za-z0-9._-]{1,63}$")
    #: the DRA driver whose ResourceSlices list the GPUs (NVIDIA's DRA driver: gpu.nvidia.com; AMD's: gpu.amd.com);
    #: a GPU is found there by its ``uuid`` attribute, the same UUID hermeneut's records carry
    dra_driver: str = Field(default="gpu.nvidia.com", pattern=r"^[a-z0-9.-]{1,63}$")
    #: unhealthy GPUs get NoExecute (the pods using them are evicted) instead of NoSchedule: only where the
    #: operator says so; degraded ones always get None (seen by schedulers and people, nothing evicted or refused)
    no_execute: bool = False
    #: the fleet-incident breaker: never more than this share of the cluster's GPUs under a NoSchedule or NoExecute
    #: taint at once; a GPU beyond it is marked with effect None and reported as held (NVSentinel's breaker against
    #: mass quarantine)
    max_tainted_share: float = Field(default=0.1, gt=0, le=1)
    #: API writes per second at most (conditions, rules created, changed or deleted)
    writes_per_s: float = Field(default=5.0, gt=0, le=1000)
    #: how often the cluster is reconciled with the latest health (also after each change on the topic)
    interval_s: float = Field(default=30.0, ge=1, le=3600)
    timeout_s: float = Field(default=10.0, gt=0, le=300)


class TopicSettings(_Section):
    """Topic names and partitioning; the same names on every process of one deployment."""

    raw: str = "hermeneut.samples.raw"
    context: str = "hermeneut.context"
    topology: str = "hermeneut.topology"
    interpreted: str = "hermeneut.events.interpreted"
    alerts: str = "hermeneut.alerts"
    dead_letter: str = "hermeneut.deadletter"
    ground_truth: str = "hermeneut.groundtruth"
    baselines: str = "hermeneut.baselines"
    feedback: str = "hermeneut.feedback"
    alert_state: str = "hermeneut.alerts.state"
    alert_config: str = "hermeneut.alerts.config"
    notifications: str = "hermeneut.notifications"
    #: every delivery attempt and every held notification, for the InfluxDB sink to store (pipeline.notifications)
    notification_history: str = "hermeneut.notifications.history"
    health: str = "hermeneut.health"
    partitions: int = Field(default=6, ge=1, le=1024)
    replication_factor: int = Field(default=1, ge=1, le=16)
    raw_retention_hours: float = Field(default=24.0, gt=0)

    @classmethod
    def with_prefix(cls, prefix: str, **other: Any) -> TopicSettings:
        """Every topic named ``<prefix>.<topic>`` (isolated topic sets for tests, benchmarks, evaluations)."""
        names = {name: f"{prefix}.{name}" for name, f in cls.model_fields.items() if f.annotation is str}
        return cls(**names, **other)


class ValidationSettings(_Section):
    """Plausibility limits applied by the processor before anything is stored."""

    max_future_skew_s: float = Field(default=300.0, ge=0)
    #: how old a live sample may be: at most the raw bucket's retention less a seventh of it (start-up fails
    #: otherwise), so a sample that passes is not past retention when a lagging sink writes it
    max_age_s: float = Field(default=6 * 24 * 3600.0, gt=0)
    #: how old imported history (``hermeneut import``) may be: at most the raw bucket's retention less the same
    #: margin as ``max_age_s`` (start-up fails otherwise); unset: exactly that (see :meth:`Settings.validation_limits`)
    backfill_max_age_s: float | None = Field(default=None, gt=0)


class BaselineSettings(_Section):
    """Learned baselines: how much history a baseline needs, and the application classifier."""

    #: training rows a (application, GPU model, phase) needs for its own baseline (else its prior judges it)
    min_samples: int = Field(default=300, ge=20)
    #: samples per GPU the classifier looks at, and the probability below which it answers "unknown"
    classifier_window: int = Field(default=30, ge=5, le=600)
    classifier_min_confidence: float = Field(default=0.6, ge=0.0, le=1.0)
    #: seconds a GPU must be anomalous before a baseline-anomaly finding fires, and calm before it clears
    anomaly_after_s: float = Field(default=300.0, ge=0)
    anomaly_clear_s: float = Field(default=120.0, ge=0)
    #: distinct GPUs a baseline must have learned from before it may condemn (fewer: it judges like a prior)
    min_gpus: int = Field(default=4, ge=1)
    #: a prior (pooled over models, learned from too few GPUs or from another cluster) flags a row as unusual only
    #: beyond this many times its anomalous threshold, and never as anomalous
    prior_widening: float = Field(default=2.0, ge=1.0)
    #: share of a job's GPUs anomalous together above which the job, not a GPU, is what differs
    job_share: float = Field(default=0.5, gt=0.0, le=1.0)


class ServiceSettings(_Section):
    """Where local services keep their builds (per version) and their per-run data and logs."""

    cache_dir: Path = Field(default_factory=_default_cache_dir)
    state_dir: Path = Field(default_factory=_default_state_dir)


#: Default inhibition rules (``;``-separated, see alerting/model.py ``parse_inhibit_rule``): a node that
#: stopped reporting mutes its other alerts; a GPU that fell off the bus mutes that GPU's other alerts.
DEFAULT_INHIBIT_RULES = (
    'detector="node-silent" -> detector!="node-silent" on cluster,node; '
    'detector="fallen-off-bus" -> detector!="fallen-off-bus" on cluster,node,gpu'
)


class AlertSettings(_Section):
    """Alert lifecycle, grouping and delivery defaults (a subscription may override the grouping timers)."""

    #: how long a condition must hold before its alert fires (hysteresis on top of the detectors' own)
    for_s: float = Field(default=0.0, ge=0, le=86_400)
    #: how long a cleared alert keeps firing, so a short clear does not resolve and re-fire
    keep_firing_s: float = Field(default=0.0, ge=0, le=86_400)
    #: an alert whose finding is not repeated for this long is marked stale and stays open (findings repeat every
    #: 60 s; silence is no evidence that it cleared: alerting/lifecycle.py)
    stale_after_s: float = Field(default=180.0, gt=0, le=86_400)
    #: resolved alerts are forgotten (and their state tombstoned) after this long
    forget_after_s: float = Field(default=86_400.0, gt=0)
    #: flap damping: this many firing/resolved changes within ``flap_window_s`` make an alert "flapping";
    #: its notifications are held until it has been stable for ``flap_quiet_s``, then one summary goes out
    flap_threshold: int = Field(default=4, ge=2, le=1000)
    flap_window_s: float = Field(default=600.0, gt=0)
    flap_quiet_s: float = Field(default=300.0, gt=0)
    group_by: str = "cluster,node,detector"
    group_wait_s: float = Field(default=30.0, ge=0, le=86_400)
    group_interval_s: float = Field(default=300.0, ge=0, le=86_400)
    repeat_interval_s: float = Field(default=4 * 3600.0, gt=0, le=30 * 86_400)
    #: delivery retries: exponential backoff with jitter from ``retry_initial_s`` up to ``retry_max_s``,
    #: given up (outcome "failed") once a notification is ``retry_max_age_s`` old
    retry_initial_s: float = Field(default=1.0, gt=0, le=3600)
    retry_max_s: float = Field(default=60.0, gt=0, le=3600)
    retry_max_age_s: float = Field(default=3600.0, gt=0, le=7 * 86_400)
    http_timeout_s: float = Field(default=10.0, gt=0, le=300)
    #: how often the manager evaluates timers (group wait, staleness, flapping)
    tick_s: float = Field(default=0.5, gt=0, le=60)
    #: where links in notifications point (the hermeneut web app)
    external_url: str = "http://127.0.0.1:8080"
    inhibit_rules: str = DEFAULT_INHIBIT_RULES
    #: sender address of e-mail notifications
    email_from: str = "hermeneut@localhost"
    #: webhook and Slack targets (comma-separated host names, addresses or networks such as 127.0.0.1 or
    #: 10.0.0.0/8) allowed although they are loopback, link-local or a cloud metadata address, which are refused
    #: otherwise (alerting/targets.py): a self-service subscription must not make the manager an SSRF proxy
    allowed_targets: str = ""
    #: finding kinds run store-only (shadow mode, alerting/shadow.py): stored, never alerted, notified or
    #: counted in a GPU's health; the alerts they would have raised are counted (comma-separated, e.g. "power-brake")
    shadow: str = Field(default="", pattern=r"^[a-z0-9, -]*$")

    @property
    def shadow_kinds(self) -> frozenset[str]:
        return frozenset(_comma_list(self.shadow))

    @field_validator("allowed_targets")
    @classmethod
    def _targets(cls, value: str) -> str:
        for entry in _comma_list(value):
            try:
                ipaddress.ip_network(entry, strict=False)
            except ValueError:
                if not _HOST_NAME.match(entry):
                    raise ValueError(f"{entry!r} is neither a host name, an address nor a network") from None
        return value


class ContextSettings(_Section):
    """Workload-context sources of ``hermeneut context watch`` (one watch per node)."""

    #: how often the sources are polled
    interval_s: float = Field(default=10.0, ge=0.5, le=3600)
    #: how often the whole current state is published again (repairs lost records in the compacted topic)
    reassert_s: float = Field(default=600.0, ge=10, le=86400)
    #: ceiling of the retry backoff of a failing source
    backoff_max_s: float = Field(default=300.0, ge=1, le=3600)
    #: where the Slurm prolog writes <jobid>.env files
    slurm_dir: Path = Path("/run/hermeneut/slurm")
    kubelet_socket: Path = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
    #: Kubernetes API server URL; unset: the in-cluster one (KUBERNETES_SERVICE_HOST) with the pod's token
    kubernetes_api: str | None = None
    kubernetes_token_file: Path | None = None
    kubernetes_ca_file: Path | None = None
    #: the host's /proc (mount it and set this when the watch runs in a container)
    proc_root: Path = Path("/proc")
    #: timeout of squeue / scontrol / nvidia-smi / API calls
    command_timeout_s: float = Field(default=10.0, gt=0, le=300)


class CollectorSettings(_Section):
    """The node agent (``hermeneut collect``): which source, and how it buffers. Its interval is
    ``sample_interval_s``."""

    #: a source registered in pipeline.registry (nvml, dcgm-exporter, amd-exporter, amd-smi, simulator)
    source: str = "nvml"
    #: the node name samples carry; unset: this host's name
    node: str | None = Field(default=None, min_length=1, max_length=253)
    #: where the node sits, as the operator names it (a Kubernetes node label such as topology.kubernetes.io/zone or
    #: a rack label, Slurm's topology.conf): its rack and the leaf switch its NICs hang off. Findings carry them, and
    #: one finding on several nodes of one rack or switch at once is that place's incident (docs/health.md)
    rack: str = Field(default="", max_length=253)
    switch: str = Field(default="", max_length=253)
    #: where the node's maintenance state comes from ("": nowhere): "slurm" (scontrol show node) or "kubernetes"
    #: (the Node object: cordoned). Checked with the topology; a node held out of service on purpose is not a fault
    maintenance: Literal["", "slurm", "kubernetes"] = ""
    dcgm_exporter_url: str = "http://127.0.0.1:9400/metrics"
    scrape_timeout_s: float = Field(default=5.0, gt=0, le=300)
    #: where sysfs is (InfiniBand ports, PCI paths, NUMA); a folder for tests and containers
    sysfs_root: Path = Path("/sys")
    #: NVML's sampled PCIe throughput (2 x 20 ms per GPU) where the PCIe byte counters are not supported
    pcie_throughput_fallback: bool = True
    #: an NVML reading that costs more CPU than this per read (its cheapest read in rounds 2-4) is read every
    #: ``costly_read_interval_s`` (rounded to rounds; never more often than every round). A real H100's total
    #: energy counter costs 3.9 ms of CPU per read (tests/testdata/nvml-h100-lent). An interval of 0 reads every
    #: reading every round
    costly_read_us: float = Field(default=100.0, ge=0, le=1e6)
    costly_read_interval_s: float = Field(default=30.0, ge=0, le=3600)
    topology_interval_s: float = Field(default=60.0, ge=1, le=86_400)
    #: the producer's buffer while Kafka is away; when full, the agent stops sampling until there is room
    buffer_mib: int = Field(default=256, ge=1, le=16_384)
    #: how long a message may wait for Kafka before it counts as failed; 0 = never give up
    delivery_timeout_s: float = Field(default=0.0, ge=0, le=7 * 24 * 3600)
    #: after SIGTERM, how long the agent keeps flushing to an unreachable Kafka before it exits
    shutdown_grace_s: float = Field(default=30.0, ge=0, le=3600)

    @field_validator("source")
    @classmethod
    def _registered(cls, value: str) -> str:
        if value not in registry.names("source"):
            raise ValueError(f"unknown source {value!r} (known: {', '.join(registry.names('source'))})")
        return value

    @field_validator("dcgm_exporter_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"expected an http:// or https:// URL, got {value!r}")
        return value


class DetectorSettings(_Section):
    """The domain detectors' timing and thresholds (processors/detectors/; docs/detectors.md says why each)."""

    enabled: bool = True
    #: a finding that still holds is sent again this often
    repeat_s: float = Field(default=60.0, ge=1.0, le=3600.0)
    #: a GPU silent this long while its node still reports has fallen off the bus, where its samples do not say their
    #: interval (with one: three of its intervals)
    lost_after_s: float = Field(default=15.0, ge=2.0, le=3600.0)
    #: XIDs (other than memory errors and 79) within ``storm_window_s`` that make a storm
    storm_count: int = Field(default=5, ge=2, le=10_000)
    storm_window_s: float = Field(default=300.0, ge=10.0, le=86_400.0)
    #: per-GPU step-time windows compared across the GPUs of one job
    straggler_window_s: float = Field(default=30.0, ge=5.0, le=3600.0)
    #: how long memory must keep growing linearly before it is called a leak
    leak_confirm_s: float = Field(default=240.0, ge=30.0, le=86_400.0)
    #: a fast, straight-line growth is a leak at once when it projects to full memory within this long
    leak_fast_full_s: float = Field(default=600.0, ge=0.0, le=86_400.0)
    #: a lowered power limit must hold this long, away from a job start, to be a fault and not a setting
    power_confirm_s: float = Field(default=120.0, ge=0.0, le=3600.0)
    #: a job change within this long of a power-limit change makes the change a setting, not a fault
    job_boundary_s: float = Field(default=120.0, ge=0.0, le=3600.0)
    #: the processor's per-GPU state of an import (a lane behind its node's live data) is freed once no row came to
    #: it for this long (s, wall time while data flows: a pause with no data at all, e.g. Kafka down, counts at most
    #: 30 s): an import's messages come seconds apart while it runs, so 10 minutes idle is an import done; kept,
    #: every import of older data would grow the state for good (processors/state.py). What the freed lane had open
    #: goes without a message (its findings are history). 0: never freed
    lane_idle_s: float = Field(default=600.0, ge=0.0, le=86_400.0)


#: the escalation and correlation rules (pipeline/escalation.py), by the name their reasons carry
ESCALATION_RULES: Final = ("repeated-fatal", "recurring-fault", "lemon-node", "xid-follows-gpu", "xid-across-job")


class HealthSettings(_Section):
    """Escalation and correlation over each GPU's finding history (pipeline/escalation.py; docs/health.md has the
    source of each default)."""

    #: this many fatal episodes on one GPU within the window: RMA (NVSentinel: a fatal XID 5 times in 24 h)
    fatal_count: int = Field(default=5, ge=2, le=1000)
    fatal_window_s: float = Field(default=86_400.0, ge=60, le=30 * 86_400)
    #: this many episodes of one hard fault on one GPU within the window: it survived the resets between them,
    #: hardware inspection (gpud escalates to hardware inspection when a reboot did not help twice)
    recur_count: int = Field(default=3, ge=2, le=1000)
    recur_window_s: float = Field(default=7 * 86_400.0, ge=60, le=30 * 86_400)
    #: this many remediations (episodes asking for a reset or more) on one node within the window: a lemon node
    #: (NVSentinel's MultipleRemediations rule, 7 days)
    lemon_count: int = Field(default=5, ge=2, le=1000)
    lemon_window_s: float = Field(default=7 * 86_400.0, ge=60, le=30 * 86_400)
    #: an application XID on one GPU in this many different jobs (and on no other GPU of them) within the window
    #: is the GPU's; on this many GPUs of one job it is the application's (NVSentinel's XID 13/31 workflows)
    correlate_count: int = Field(default=2, ge=2, le=1000)
    correlate_window_s: float = Field(default=86_400.0, ge=60, le=30 * 86_400)
    #: rules run in shadow mode, comma-separated (a new or changed rule, NVSentinel's dry run): their reasons are
    #: worked out and reported as what they would have done, but change no state, no remedy, nothing on the topic
    shadow: str = Field(default="", pattern=r"^[a-z0-9, -]*$")

    @field_validator("shadow")
    @classmethod
    def _known_rules(cls, value: str) -> str:
        unknown = sorted(set(_comma_list(value)) - set(ESCALATION_RULES))
        if unknown:
            raise ValueError(f"unknown escalation rule {unknown[0]!r} (known: {', '.join(ESCALATION_RULES)})")
        return value

    @property
    def shadow_rules(self) -> frozenset[str]:
        return frozenset(_comma_list(self.shadow))

    @property
    def lookback_s(self) -> float:
        """How far back the history must reach for every rule."""
        return max(self.fatal_window_s, self.recur_window_s, self.lemon_window_s, self.correlate_window_s)


class StorageSettings(_Section):
    """Retention of the InfluxDB buckets (raw, 1-minute rollups, job summaries) and when queries read rollups."""

    raw_retention_days: float = Field(default=7.0, ge=1, le=3650)
    rollup_retention_days: float = Field(default=90.0, ge=1, le=3650)
    jobs_retention_days: float = Field(default=400.0, ge=1, le=3650)
    #: queries over ranges longer than this read the 1-minute rollups
    rollup_after_days: float = Field(default=2.0, gt=0, le=3650)


class WebSettings(_Section):
    """The HTTP API (``hermeneut web``): where it listens and the bearer token it asks for."""

    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=1, le=65535)
    #: required from clients when ``host`` is not loopback; generated into the state dir when unset
    token: SecretStr | None = None
    #: host names (comma-separated) a loopback server also answers to, besides loopback ones: a reverse proxy's
    #: name; any other Host header is refused, so a DNS-rebinding page cannot reach the API through its own name
    allowed_hosts: str = ""

    @field_validator("allowed_hosts")
    @classmethod
    def _host_names(cls, value: str) -> str:
        for name in _comma_list(value):
            if not _HOST_NAME.match(name):
                raise ValueError(f"{name!r} is not a host name")
        return value

    def allowed_host_names(self) -> frozenset[str]:
        return frozenset(name.lower() for name in _comma_list(self.allowed_hosts))


#: the stages that serve /metrics, each on its own port (``metrics.<stage>_port``)
METRICS_STAGES: tuple[str, ...] = ("collect", "context", "process", "sink", "alerts", "web", "kubernetes")


class MetricsSettings(_Section):
    """Where each long-running stage serves ``/metrics`` for Prometheus (pipeline/metrics.py, docs/metrics.md).

    Loopback by default: set ``host`` to ``0.0.0.0`` (or the node's address) when Prometheus runs elsewhere. Each
    stage has its own port, so all of them can run on one host; 0 picks a free port (the CLI prints it).
    """

    enabled: bool = True
    host: str = "127.0.0.1"
    collect_port: int = Field(default=9471, ge=0, le=65535)
    context_port: int = Field(default=9472, ge=0, le=65535)
    process_port: int = Field(default=9473, ge=0, le=65535)
    sink_port: int = Field(default=9474, ge=0, le=65535)
    alerts_port: int = Field(default=9475, ge=0, le=65535)
    web_port: int = Field(default=9476, ge=0, le=65535)
    kubernetes_port: int = Field(default=9477, ge=0, le=65535)
    #: a GPU's verdict, or an open finding, not heard of for this long leaves the processor's exposition (the node
    #: went away, or its partition moved to another processor, which exposes it from then on)
    stale_after_s: float = Field(default=180.0, gt=0, le=86_400)

    def port(self, stage: str) -> int:
        """The port of ``stage`` (one of METRICS_STAGES)."""
        port: int = getattr(self, f"{stage}_port")
        return port


def retention_margin_s(retention_s: float) -> float:
    """How far inside the raw bucket's retention the live age bound must stay: a seventh of it (a day of the
    default week), the time a sink may lag behind and still store what the processor let through."""
    return retention_s / 7


class Settings(BaseSettings):
    """Everything a hermeneut process needs to know before it connects to anything."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, env_nested_delimiter="__", extra="forbid", frozen=True)

    cluster: str = Field(default="local", min_length=1, max_length=64)
    #: consumer groups are "<prefix>-processor" and "<prefix>-sink-influxdb"
    group_prefix: str = Field(default="hermeneut", pattern=r"^[A-Za-z0-9._-]{1,100}$")
    sample_interval_s: float = Field(default=1.0, ge=0.1, le=3600)
    kafka: KafkaSettings = KafkaSettings()
    influxdb: InfluxSettings = InfluxSettings()
    otlp: OtlpSettings = OtlpSettings()
    kubernetes: KubernetesSettings = KubernetesSettings()
    topics: TopicSettings = TopicSettings()
    validation: ValidationSettings = ValidationSettings()
    baselines: BaselineSettings = BaselineSettings()
    services: ServiceSettings = ServiceSettings()
    alerts: AlertSettings = AlertSettings()
    context: ContextSettings = ContextSettings()
    collector: CollectorSettings = CollectorSettings()
    detectors: DetectorSettings = DetectorSettings()
    health: HealthSettings = HealthSettings()
    storage: StorageSettings = StorageSettings()
    web: WebSettings = WebSettings()
    metrics: MetricsSettings = MetricsSettings()
    #: the TOML file below the environment; set only on the class :func:`load_settings` builds for a file
    toml_file: ClassVar[Path | None] = None

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Keyword arguments, then the environment, then :attr:`toml_file` (see :func:`load_settings`)."""
        if cls.toml_file is None:
            return init_settings, env_settings
        return init_settings, env_settings, TomlConfigSettingsSource(settings_cls, toml_file=cls.toml_file)

    @model_validator(mode="after")
    def _age_inside_retention(self) -> Settings:
        retention_s = self.storage.raw_retention_days * 86_400
        oldest = retention_s - retention_margin_s(retention_s)
        v = self.validation
        for name, age_s in (("max_age_s", v.max_age_s), ("backfill_max_age_s", v.backfill_max_age_s)):
            if age_s is not None and age_s > oldest:
                raise ValueError(
                    f"validation.{name} ({age_s:g} s) must be at most the raw retention ({retention_s:g} s, "
                    f"storage.raw_retention_days) less a margin of {retention_margin_s(retention_s):g} s: older "
                    "samples would pass and then be refused by InfluxDB"
                )
        return self

    def validation_limits(self) -> ValidationSettings:
        """:attr:`validation` with the backfill bound filled in when unset: the raw bucket's retention less the
        margin (:func:`retention_margin_s`), so imported history that passes is not past retention when a lagging
        sink writes it."""
        if self.validation.backfill_max_age_s is not None:
            return self.validation
        retention_s = self.storage.raw_retention_days * 86_400
        oldest = retention_s - retention_margin_s(retention_s)
        return self.validation.model_copy(update={"backfill_max_age_s": oldest})

    @property
    def uses_local_kafka(self) -> bool:
        return self.kafka.bootstrap_servers is None

    @property
    def uses_local_influxdb(self) -> bool:
        return self.influxdb.url is None


def _one_line(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "settings"
        msg = err["msg"].removeprefix("Value error, ")
        value = err.get("input")
        shown = "" if isinstance(value, dict) or "password" in where or "token" in where else f" (got {value!r})"
        parts.append(f"{where}: {msg}{shown}")
    return "invalid configuration: " + "; ".join(parts)


#: HERMENEUT_ variables that are not settings of the object but are read elsewhere
_OTHER_ENV = frozenset({CONFIG_FILE_ENV, "HERMENEUT_RUSTUP_TOOLCHAIN"})


def _reject_unknown_env() -> None:
    """A misspelt variable would otherwise be ignored silently (and, say, start a local Kafka instead)."""
    known = env_names() | _OTHER_ENV
    for name in sorted(os.environ):
        if name.startswith(ENV_PREFIX) and name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise ConfigError(f"invalid configuration: unknown setting {name}{hint}")


def _from_file(toml_file: Path) -> type[Settings]:
    """:class:`Settings` that also read ``toml_file``, below the environment in priority."""
    return type("SettingsFromFile", (Settings,), {"toml_file": toml_file})


def load_settings(config_file: Path | None = None, **overrides: Any) -> Settings:
    """Build the settings from ``overrides``, the environment and the TOML file (``config_file``, else the one
    ``HERMENEUT_CONFIG`` names), or raise :class:`ConfigError` with one readable line. Reads the environment,
    never writes it."""
    if config_file is not None and not config_file.is_file():
        raise ConfigError(f"invalid configuration: config file {config_file} does not exist")
    _reject_unknown_env()
    if config_file is None and os.environ.get(CONFIG_FILE_ENV):
        config_file = Path(os.environ[CONFIG_FILE_ENV])
        if not config_file.is_file():
            raise ConfigError(f"invalid configuration: {CONFIG_FILE_ENV}={config_file} does not exist")
    try:
        if config_file is None:
            return Settings(**overrides)
        loaded = _from_file(config_file)(**overrides)
    except ValidationError as exc:
        raise ConfigError(_one_line(exc)) from exc
    except ValueError as exc:  # malformed TOML or env JSON
        raise ConfigError(f"invalid configuration: {exc}".splitlines()[0]) from exc
    # the plain class, validated above, so settings from a file compare equal to the same settings built directly
    return Settings.model_construct(loaded.model_fields_set, **dict(loaded))


def settings_env(settings: BaseModel, prefix: str = ENV_PREFIX) -> dict[str, str]:
    """The settings as environment variables (the inverse of loading them); None values are left out."""
    env: dict[str, str] = {}
    for name in type(settings).model_fields:
        value = getattr(settings, name)
        key = f"{prefix}{name.upper()}"
        if isinstance(value, BaseModel):
            env |= settings_env(value, f"{key}__")
        elif value is not None:
            env[key] = value.get_secret_value() if isinstance(value, SecretStr) else str(value)
    return env


def env_names(model: type[BaseModel] = Settings, prefix: str = ENV_PREFIX) -> set[str]:
    """Every environment variable name the settings understand (used to check docker-compose.yml)."""
    names: set[str] = set()
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            names |= env_names(annotation, f"{prefix}{name.upper()}__")
        else:
            names.add(f"{prefix}{name.upper()}")
    return names
