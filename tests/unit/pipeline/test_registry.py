"""Every plugin in pipeline.registry, loaded by name and run against its contract (the Telegraf habit):

- every entry imports, names itself, has a frozen default config, and is built by configure -> validate ->
  from_config without connecting anything;
- every source opens, collects, reports its topology and stats and closes on a stand-in that needs no hardware:
  NVML on the NVML replay of real ``nvidia-smi -q -x`` captures, dcgm-exporter on a recorded ``/metrics`` served
  over local HTTP, amd-exporter on AMD's documented exposition examples, the simulator as it is; and emits only the
  fields it declares;
- every sink validates its config (one line, no secret in it), prepares real messages, adds, flushes and closes;
- every context source is built for a node's GPUs (the nvidia-smi -L of a real 8xH100 node) without connecting, and
  polled on its stand-in (the real Slurm prolog's files, recorded squeue and scontrol output, the kubelet's pods,
  the command lines of live processes) answers with workloads of those GPUs only.

A plugin added to the registry without a case here fails :func:`test_every_plugin_has_a_conformance_case`.
"""

from __future__ import annotations

import dataclasses
import http.server
import os
import socket
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pipeline import registry
from pipeline.codec import decode_samples, encode_interpreted, encode_record, encode_samples
from pipeline.config import InfluxSettings, Settings
from pipeline.errors import ConfigError, DecodeError, PermanentWriteError, TransientWriteError
from pipeline.events import METRIC_NAMES, FaultRecord, Finding, GpuContext, GpuProcess, SampleBatch, Severity
from pipeline.notifications import NotificationRecord
from pipeline.topology import NodeTopology
from processors.normalize import RawMessage, process_raw
from producers.context.slurm import PROLOG
from producers.nvml.replay import ReplayNvml
from producers.simulator import FaultPlan, Fleet, Injection
from sinks.base import Position
from sinks.influxdb.lines import InfoTracker, batch_lines, finding_line, notification_line
from tests import TESTDATA
from tests.fakes.context import FakeSlurm
from tests.fakes.kubernetes import INVENTORY, POD_RESOURCES
from tests.fakes.nvml import capture_names, load_capture

T0 = 1_800_000_000_000_000_000
DCGM_SAMPLE = TESTDATA / "dcgm-exporter" / "a100-mig-node.txt"
AMD_SAMPLE = TESTDATA / "amd" / "device-metrics-exporter-docs" / "metricslist-examples.prom"
#: amd-smi's answer to ``static`` and ``metric``: a real MI210's static, AMD's documented power readings
AMD_SMI = TESTDATA / "amd" / "amd-smi"
AMD_SMI_OUTPUT = {"static": "mi210-static.json", "metric": "changelog-metric-power.json"}
PLUGINS = [(kind, name) for kind, names in registry.PLUGINS.items() for name in names]


@pytest.fixture
def no_connections(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any attempt to open a network connection fails the test."""

    def refuse(*_args: Any, **_kwargs: Any) -> None:
        raise AssertionError("a plugin connected while it was only being built")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


@pytest.fixture(scope="module")
def exporter() -> Iterator[str]:
    """The recorded dcgm-exporter answer, served on loopback."""
    body = DCGM_SAMPLE.read_bytes()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/metrics"
    server.shutdown()
    server.server_close()


def settings(**influx: Any) -> Settings:
    return Settings(cluster="dc1", influxdb=InfluxSettings(**influx))


XID_STORM_AT_1S = FaultPlan(0.0, injections=(Injection("xid-storm", 1, 60),))
#: per source: options for configure, and the stand-ins it is built with
SourceCase = Callable[[str, Path], tuple[dict[str, Any], dict[str, Any]]]
SOURCES: dict[str, SourceCase] = {
    "nvml": lambda _url, tmp: (
        {"node": "n1", "sysfs_root": tmp},
        {"nvml": ReplayNvml(load_capture("dual_2080-v13.xml"))},
    ),
    "dcgm-exporter": lambda url, _tmp: ({"url": url, "node": "n1"}, {}),
    "amd-exporter": lambda _url, _tmp: ({"node": "n1"}, {"fetch": lambda _u, _t: AMD_SAMPLE.read_bytes()}),
    "amd-smi": lambda _url, _tmp: (
        {"node": "n1"},
        {"run": lambda argv, _t: (AMD_SMI / AMD_SMI_OUTPUT[argv[1]]).read_text()},
    ),
    "simulator": lambda _url, _tmp: (
        {"nodes": 2, "gpus": 4},
        {"fleet": Fleet(2, 4, cluster="dc1", seed=1, faults=XID_STORM_AT_1S)},
    ),
}


class RecordingWriter:
    """The InfluxDB writer's stand-in: keeps the lines; ``fail`` is raised by the next write."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.fail: Exception | None = None
        self.closed = 0

    def write(self, lines: list[str]) -> None:
        if self.fail is not None:
            failure, self.fail = self.fail, None
            raise failure
        self.lines += lines

    def ensure_bucket(self, retention_s: int) -> None:
        self.ensured = retention_s

    def close(self) -> None:
        self.closed += 1


SINKS: dict[str, Callable[[], tuple[Settings, dict[str, Any]]]] = {
    "influxdb": lambda: (
        settings(url="http://127.0.0.1:9", token="t0k3n"),
        # the sink's clock at the batches' time: rows far ahead of it are refused
        {"writer": RecordingWriter(), "rollup_writer": RecordingWriter(), "clock": lambda: T0},
    ),
}


#: sinks whose conformance case lives beside their own tests (their stand-in is a server, not a writer)
SINK_CASES_ELSEWHERE = {"otlp": "tests/unit/sinks/otlp/test_sink.py::test_the_plugin_runs_against_the_contract"}


class Pods:
    """The kubelet's stand-in: the pods of tests/fakes/kubernetes.py, without the gRPC socket."""

    def list(self) -> list[Any]:
        return list(POD_RESOURCES)


def _slurm_job(tmp: Path) -> Path:
    """A job on GPUs 0 and 1, written by the shipped prolog as Slurm runs it."""
    env = {"PATH": os.environ["PATH"], "HERMENEUT_SLURM_DIR": str(tmp), "SLURM_JOB_ID": "77", "SLURM_JOB_GPUS": "0,1"}
    subprocess.run(["bash", str(PROLOG)], env=env, check=True, capture_output=True)
    return tmp


#: per context source: options for configure, and the stand-ins it is built with (besides node and inventory)
CONTEXT: dict[str, Callable[[Path], tuple[dict[str, Any], dict[str, Any]]]] = {
    "static": lambda tmp: ({"path": _written(tmp / "jobs.csv", "node,gpu,application\ngpu01,0,rendering\n")}, {}),
    "slurm-dir": lambda tmp: ({"slurm_dir": _slurm_job(tmp)}, {}),
    "squeue": lambda _tmp: (
        {},
        {"runner": FakeSlurm((TESTDATA / "context" / "squeue-gpu01.txt").read_text(), SCONTROL)},
    ),
    "kubernetes": lambda _tmp: ({"kubernetes_api": "http://127.0.0.1:9"}, {"kubelet": Pods()}),
    # a renderer on GPU 2, gone from /proc (beyond pid_max): nvidia-smi's command line is the evidence
    "processes": lambda _tmp: ({}, {"lister": lambda: {"2": [GpuProcess(2**22 + 1, "/usr/bin/blender -b a.blend")]}}),
}
SCONTROL = (TESTDATA / "context" / "scontrol-show-job-d.txt").read_text()


def _written(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_every_plugin_has_a_conformance_case() -> None:
    assert set(registry.names("source")) == set(SOURCES)
    assert set(registry.names("sink")) == set(SINKS) | set(SINK_CASES_ELSEWHERE)
    assert set(registry.names("context")) == set(CONTEXT)


@pytest.mark.parametrize("name", sorted(CONTEXT))
def test_every_context_source_is_built_without_connecting_and_polls_its_gpus(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    options, deps = CONTEXT[name](tmp_path)
    with monkeypatch.context() as m:
        m.setattr(socket.socket, "connect", lambda *_a: pytest.fail(f"{name} connected while being built"))
        source = registry.create(
            "context", name, settings(), {"node": "gpu01", "inventory": INVENTORY, **deps}, **options
        )
    assert source.name == name
    if name == "kubernetes":
        source.api = None  # the kubelet's answer alone: the API server's part has its own tests
    observed = source.poll()
    assert observed, f"{name} saw no workload on its stand-in"
    assert set(observed) <= set(INVENTORY.uuids) and all(w.application for w in observed.values())


@pytest.mark.parametrize(("kind", "name"), PLUGINS)
def test_a_plugins_defaults_are_the_settings_defaults(kind: registry.Kind, name: str) -> None:
    """A setting is declared once: configured from the default settings, a plugin has its default Config (a
    default written twice, in the settings and in the plugin, would drift apart)."""
    assert registry.load(kind, name).configure(Settings()) == registry.load(kind, name).Config()


@pytest.mark.parametrize(("kind", "name"), PLUGINS)
def test_every_plugin_loads_by_name_with_a_default_config(kind: registry.Kind, name: str) -> None:
    plugin = registry.load(kind, name)
    assert plugin.name == name
    default = plugin.Config()
    assert dataclasses.is_dataclass(default)
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(default, dataclasses.fields(default)[0].name, None)
    assert type(plugin.configure(settings())) is plugin.Config
    for method in ("configure", "validate", "from_config"):
        assert callable(getattr(plugin, method))


def test_unknown_names_and_options_are_one_line_config_errors() -> None:
    known = r"\(known: nvml, dcgm-exporter, amd-exporter, amd-smi, simulator\)"
    with pytest.raises(ConfigError, match=rf"unknown source 'nvm' {known}"):
        registry.load("source", "nvm")
    with pytest.raises(ConfigError, match="the nvml source has no setting 'url'"):
        registry.create("source", "nvml", settings(), url="http://x:9400/metrics")


@pytest.mark.parametrize("name", sorted(SOURCES))
@pytest.mark.usefixtures("no_connections")
def test_building_a_source_connects_to_nothing(name: str, tmp_path: Path) -> None:
    options, deps = SOURCES[name]("http://127.0.0.1:9/metrics", tmp_path)
    source = registry.create("source", name, settings(), deps, **options)
    assert source.name == name
    assert not any(isinstance(d, ReplayNvml) and d.initialized for d in deps.values())  # NVML not initialised


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_every_source_runs_against_the_contract(name: str, exporter: str, tmp_path: Path) -> None:
    options, deps = SOURCES[name](exporter, tmp_path)
    source = registry.create("source", name, settings(), deps, **options)
    assert isinstance(source.fields, frozenset) and source.fields <= set(METRIC_NAMES)
    source.open()
    try:
        seen: set[str] = set()
        kinds: set[type] = set()
        for r in range(3):
            ts = T0 + r * 10**9
            records = source.collect(ts)
            assert records, "a round read nothing"
            for record in records:
                assert isinstance(record, SampleBatch | GpuContext | FaultRecord)
                kinds.add(type(record))
                if isinstance(record, SampleBatch):
                    assert all(s.ts_ns == ts and s.cluster == "dc1" for s in record.samples)
                    decoded, rejected = decode_samples(encode_samples(record))
                    assert rejected == [] and decoded == record
                    seen |= {k for s in record.samples for k in s.metrics}
            topologies = source.topologies(ts)
            assert topologies and all(isinstance(t, NodeTopology) and t.ts_ns == ts for t in topologies)
            stats = source.stats()
            assert all(isinstance(k, str) and isinstance(v, int) for k, v in stats.items())
        assert seen and seen <= source.fields, f"undeclared fields: {sorted(seen - source.fields)}"
        assert SampleBatch in kinds
        if name == "simulator":
            assert {GpuContext, FaultRecord} <= kinds
    finally:
        source.close()
        source.close()  # twice: safe


@pytest.mark.parametrize("capture", capture_names())
def test_nvml_emits_only_declared_fields_on_every_capture(capture: str, tmp_path: Path) -> None:
    source = registry.create(
        "source", "nvml", settings(), {"nvml": ReplayNvml(load_capture(capture))}, node="n1", sysfs_root=tmp_path
    )
    source.open()
    try:
        (batch,) = source.collect(T0)
    finally:
        source.close()
    emitted = {k for s in batch.samples for k in s.metrics}
    assert emitted and emitted <= source.fields, sorted(emitted - source.fields)


def _interpreted(fleet: Fleet) -> list[Any]:
    messages = [RawMessage(b.kafka_key, encode_samples(b), "conformance") for b in fleet.tick(T0)]
    return [batch for _, batch in process_raw(messages, T0, Settings().validation).forward]


@pytest.mark.usefixtures("no_connections")
def test_sink_validation_is_one_line_without_secrets() -> None:
    plugin = registry.load("sink", "influxdb")
    with pytest.raises(ConfigError, match="url must be http") as err:
        plugin.validate(plugin.Config())
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="no token"):
        plugin.validate(plugin.configure(settings(url="http://influx:8086")))
    config = plugin.configure(settings(url="https://influx:8086", token="s3cr3t"), timeout_s=0.0)
    with pytest.raises(ConfigError) as err:
        plugin.validate(config)
    assert "s3cr3t" not in str(err.value) and "s3cr3t" not in repr(config)
    plugin.validate(plugin.configure(settings(url="https://influx:8086", token="s3cr3t")))
    sink = registry.create("sink", "influxdb", settings(url="http://127.0.0.1:9", token="t"))  # a real client
    sink.close()


@pytest.mark.parametrize("name", sorted(SINKS))
def test_every_sink_runs_against_the_contract(name: str) -> None:
    s, deps = SINKS[name]()
    sink = registry.create("sink", name, s, deps)
    writer = deps["writer"]
    assert sink.name == name and sink.topics == (s.topics.interpreted, s.topics.alerts, s.topics.notification_history)
    batches = _interpreted(Fleet(2, 4, cluster="dc1", seed=2, extras=True))
    finding = Finding("thermal-throttling", Severity.WARNING, True, "dc1", "node-0000", "GPU-1", "H100", T0, T0, "hot")
    interpreted = [Position(s.topics.interpreted, 0, offset) for offset in range(len(batches))]
    prepared = [sink.prepare(at.topic, encode_interpreted(b), at) for at, b in zip(interpreted, batches, strict=True)]
    prepared.append(sink.prepare(s.topics.alerts, encode_record(finding), Position(s.topics.alerts, 0, 0)))
    note = NotificationRecord(T0, "dc1", "-", "sub", "thermal-throttling", "firing", "damped", "k", "f", "g", "hot",
                              "", "alice", "damped")  # fmt: skip
    at = Position(s.topics.notification_history, 0, 0)
    prepared.append(sink.prepare(at.topic, encode_record(note), at))
    assert [p.size for p in prepared] == [len(b) for b in batches] + [0, 0]
    assert all((p.ts_ns == b.ts_ns).all() for p, b in zip(prepared, batches, strict=False))
    for topic, value in ((s.topics.interpreted, b"\x00garbage"), ("elsewhere", encode_record(finding))):
        with pytest.raises(DecodeError):
            sink.prepare(topic, value, Position(topic, 0, 99))

    sink.add(prepared[:1])
    writer.fail = TransientWriteError("down")
    with pytest.raises(TransientWriteError):
        sink.flush()
    assert writer.lines == []  # kept for the retry
    sink.add(prepared[1:])
    sink.flush()
    assert writer.lines == [*batch_lines(batches, InfoTracker()), finding_line(finding), notification_line(note)]
    assert sink.stats()["points_written"] == sum(len(b) for b in batches) and sink.stats()["findings_written"] == 1
    assert sink.stats()["notifications_written"] == 1
    # one minute of samples: still open, so the runner may commit no further than its first message
    assert sink.marks() == {(s.topics.interpreted, 0): (0, f"hermeneut-rollups-closed-before={T0 // 60 // 10**9}")}

    before = len(writer.lines)
    sink.add(prepared[:1])
    writer.fail = PermanentWriteError("HTTP 400: bad")
    # a request refused as data is split (sinks/base.py): its halves, taken, are stored; nothing is refused
    assert sink.flush() == [] and writer.lines[before:] == prepared[0].payload.lines
    assert sink.flush() == []  # nothing left to write
    assert sink.stats()["points_written"] == sum(len(b) for b in batches) + len(batches[0])
    sink.close()
    sink.close()
    assert writer.closed == deps["rollup_writer"].closed == 1
